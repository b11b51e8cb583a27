"""``vlcorpus migrate ROOT``: a corpus of the flat layout (one folder of batch files per table,
before partitions) moved into partitions, file by file, so memory follows one old batch.

Rows go to their video's partition with their batch's manifest; ``_corpus.json`` is written
once every table is moved (the commit: until then the root still reads as the old layout,
and a rerun moves the same files to the same names again), then the old files are deleted.
Shards are not moved: the old shard folder is renamed ``shards-flat`` and the next build
writes shards per partition.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import graph
from pipeline.corpus import partitions
from pipeline.corpus.storage import LAYOUT_FILE, LAYOUT_VERSION, Corpus
from pipeline.corpus.tablefile import MANIFEST_KEY, STATS_KEY
from schemas.tables import key_column, schema_for

# Error items of these stages are clips (their video decides the partition); discover's are
# queries and list records, kept with the corpus.
_CLIP_STAGES = ("featurize:", "shard")


@dataclass
class MigrationReport:
    partitions: int
    files: dict[str, int] = field(default_factory=dict)  # table -> old files moved
    rows: dict[str, int] = field(default_factory=dict)
    shards_moved_to: str | None = None


def _flat_files(corpus: Corpus, table: str) -> list[str]:
    directory = corpus.path(table)
    if not corpus.fs.exists(directory):
        return []
    return sorted(p for p in corpus.fs.ls(directory, detail=False)
                  if p.endswith(".parquet") and not posixpath.basename(p).startswith((".", "_")))


def _tables(corpus: Corpus) -> list[str]:
    found = [t for t in graph.TABLES if _flat_files(corpus, t)]
    features = corpus.path(graph.FEATURES)
    if corpus.fs.exists(features):
        found += [f"{graph.FEATURES}/{posixpath.basename(p)}" for p in sorted(corpus.fs.ls(features, detail=False))
                  if _flat_files(corpus, f"{graph.FEATURES}/{posixpath.basename(p)}")]
    return found


def _partition(table: str, row: dict, count: int) -> str:
    if table != graph.ERRORS:
        video = row.get("video_id") or partitions.video_of_clip(row["clip_id"])
    elif row["stage"] == "discover":
        return partitions.CORPUS
    else:
        clip = row["stage"].startswith(_CLIP_STAGES)
        video = partitions.video_of_clip(row["item_id"]) if clip else row["item_id"]
    return partitions.partition_of(video, count)


def migrate(corpus: Corpus, requested: int | None = None) -> MigrationReport:
    """Move every flat table of ``corpus`` into partitions (``requested`` of them, or as many
    as a first build would choose for its videos)."""
    if corpus.fs.exists(corpus.path(LAYOUT_FILE)):
        count = json.loads(corpus.fs.cat(corpus.path(LAYOUT_FILE)))["partitions"]
    else:
        videos = sum(pq.ParquetFile(corpus.fs.open(p, "rb")).metadata.num_rows
                     for p in _flat_files(corpus, "videos"))
        count = requested or partitions.choose(videos)
    report = MigrationReport(count)
    tables = _tables(corpus)
    for table in tables:
        key = key_column(table)
        for path in _flat_files(corpus, table):
            with corpus.fs.open(path, "rb") as handle:
                parquet = pq.ParquetFile(handle)
                meta = parquet.schema_arrow.metadata or {}
                data = parquet.read().cast(schema_for(table))
            done = json.loads(meta[MANIFEST_KEY]) if MANIFEST_KEY in meta else None
            stats = json.loads(meta.get(STATS_KEY, b"{}"))
            labels = [_partition(table, row, count) for row in data.select(
                [c for c in ("video_id", "clip_id", "stage", "item_id") if c in data.column_names]).to_pylist()]
            keys_at: dict[str, set[str]] = {}
            for item in done or {}:
                row = {key: item, "stage": ""} if table == graph.ERRORS else {key: item}
                keys_at.setdefault(_partition(table, row, count), set()).add(item)
            name = posixpath.basename(path).removesuffix(".parquet")
            for label in sorted(set(labels) | set(keys_at)):
                rows = data.filter(pc.equal(pa.array(labels, pa.string()), label)) if labels else data.slice(0, 0)
                corpus.write_batch(table, rows, f"flat-{name}", label,
                                   done=None if done is None else keys_at.get(label, set()),
                                   stats={k: v for k, v in stats.items() if k in keys_at.get(label, ())})
            report.files[table] = report.files.get(table, 0) + 1
            report.rows[table] = report.rows.get(table, 0) + data.num_rows
    for table in tables:
        for label in corpus.partitions_of(table):
            corpus.compact(table, label)
    flat_shards = corpus.path("shards", "webdataset", "index.json")
    if corpus.fs.exists(flat_shards) and not corpus.fs.exists(corpus.path("shards", "_index")):
        corpus.fs.mv(corpus.path("shards"), corpus.path("shards-flat"), recursive=True)
        report.shards_moved_to = corpus.path("shards-flat")
    if not corpus.fs.exists(corpus.path(LAYOUT_FILE)):
        corpus.write_text(LAYOUT_FILE, json.dumps({"layout": LAYOUT_VERSION, "partitions": count}) + "\n")
    for table in tables:
        for path in _flat_files(corpus, table):
            corpus.fs.rm(path)
    return report
