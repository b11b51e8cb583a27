"""``vlcorpus validate``: every table fits its schema, every row is in its video's partition,
no key is lost between stages (the lineage of pipeline/graph.py), and every shard is as its
partition index recorded it (pipeline/shards/verify.py). Checked partition by partition, so
memory follows a partition, not the corpus."""

from __future__ import annotations

import json
import posixpath
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline import graph, partitions
from pipeline.errors import ErrorKind
from pipeline.rootlock import RootLock
from pipeline.shards.verify import Damage, check_shards, take_out
from pipeline.storage import Corpus, LayoutError
from pipeline.tablefile import MANIFEST_KEY
from schemas.tables import SCHEMA_VERSION, key_column, schema_for

LIMIT = 20  # violations of one kind listed before "... and N more"


@dataclass(frozen=True)
class Violation:
    table: str
    message: str

    def __str__(self) -> str:
        return f"{self.table}: {self.message}"


@dataclass(frozen=True)
class ShardViolation(Violation):
    damage: Damage | None = None


def validate(corpus: Corpus, hashes: bool = True) -> list[Violation]:
    """All violations found under the corpus root (empty list: valid); shards are checked by
    size, and by sha256 unless ``hashes`` is False."""
    try:
        count = corpus.recorded_partitions()
    except LayoutError as exc:
        return [Violation("(root)", str(exc))]
    problems: list[Violation] = []
    tables = corpus.tables()
    labels = set(corpus.labels())
    for table in tables:
        for partition in corpus.partitions_of(table):
            if partition != partitions.CORPUS and partition not in labels:
                problems.append(Violation(table, f"partition {partition!r} is not one of the "
                                                 f"corpus's {count} partitions"))
                continue
            problems += _check_files(corpus, table, partition)
            problems += _check_primary_key(corpus, table, partition)
    for stage, upstream, downstream in _lineage(tables):
        for partition in sorted(labels):
            problems += _check_lineage(corpus, stage, upstream, downstream, partition)
    problems += [ShardViolation("shards", str(d), d) for d in check_shards(corpus, sorted(labels), hashes)]
    return problems


def hand_back(corpus: Corpus, problems: list[Violation]) -> str | None:
    """Take the damaged shards among ``problems`` out of their partition indexes, so that
    ``status`` counts their clips as not sharded and the next build writes them again; not while
    a build holds the root (it may be writing those indexes). What was done, in one line (None:
    no damaged shard)."""
    damage = [p.damage for p in problems
              if isinstance(p, ShardViolation) and p.damage is not None and p.damage.number >= 0]
    if not damage:
        return None
    shards = len({(d.partition, d.split, d.number) for d in damage})
    lock = RootLock(corpus.url, "vlcorpus validate")
    holder = lock.try_acquire()
    if holder is not None:
        return (f"{shards} damaged shards stay in the shard index: {holder.describe()} holds the "
                f"root; run validate again once it ends, and the build after that writes them again")
    try:
        take_out(corpus, damage)
    finally:
        lock.release()
    return f"{shards} damaged shards taken out of the shard index: the next build writes them again"


def _lineage(tables: list[str]) -> list[tuple[str, str, str]]:
    pairs = [p for p in graph.LINEAGE if p[2] in tables]
    return pairs + [lineage for t in tables if (lineage := graph.family_lineage(t)) is not None]


def _video_ids(table: str, data: pa.Table) -> list[str]:
    if "video_id" in data.column_names:
        return data.column("video_id").to_pylist()
    return [partitions.video_of_clip(c) for c in data.column("clip_id").to_pylist()]


def _check_files(corpus: Corpus, table: str, partition: str) -> list[Violation]:
    expected = schema_for(table)
    key = key_column(table)
    problems = []
    for path in corpus.table_files(table, partition):
        name = f"partition={partition}/{posixpath.basename(path)}"
        with corpus.fs.open(path, "rb") as handle:
            try:
                parquet = pq.ParquetFile(handle)
                schema = parquet.schema_arrow
                columns = ["kind"] if table == graph.ERRORS else [
                    f.name for f in expected if f.name not in ("values", "words")]
                data = parquet.read(columns=columns)
            except (pa.ArrowInvalid, OSError) as exc:
                problems.append(Violation(table, f"{name}: unreadable Parquet ({exc})"))
                continue
        metadata = schema.metadata or {}
        version = metadata.get(b"vlcorpus.schema_version", b"").decode()
        if version != SCHEMA_VERSION:
            problems.append(Violation(table, f"{name}: schema version {version or 'missing'!r}, "
                                             f"expected {SCHEMA_VERSION!r}"))
        if not schema.remove_metadata().equals(expected.remove_metadata()):
            diff = _schema_diff(schema, expected)
            problems.append(Violation(table, f"{name}: schema differs from schemas/: {diff}"))
            continue
        if table == graph.ERRORS:
            bad = set(data.column("kind").to_pylist()) - {k.value for k in ErrorKind}
            if bad:
                problems.append(Violation(table, f"{name}: unknown error kinds {sorted(bad)}"))
            continue
        for field in expected:
            if field.name in data.column_names and not field.nullable and data.column(field.name).null_count:
                problems.append(Violation(table, f"{name}: nulls in column {field.name!r}"))
        elsewhere = sorted({v for v in _video_ids(table, data)
                            if partitions.partition_of(v, corpus.partitions) != partition})
        if elsewhere:
            problems.append(Violation(table, f"{name}: rows of videos of other partitions: "
                                             f"{elsewhere[:5]}"))
        raw = metadata.get(MANIFEST_KEY)
        if raw is None:
            problems.append(Violation(table, f"{name}: no batch manifest in the footer"))
            continue
        manifest = json.loads(raw)
        in_rows = set(pc.unique(data.column(key)).to_pylist())
        empty = set(manifest.get("empty", []))
        if manifest.get("rows") != data.num_rows:
            problems.append(Violation(table, f"{name}: {data.num_rows} rows, its manifest "
                                             f"recorded {manifest.get('rows')}"))
        if empty & in_rows:
            problems.append(Violation(table, f"{name}: keys with rows recorded as empty: "
                                             f"{sorted(empty & in_rows)[:5]}"))
        if manifest.get("keys") != len(in_rows | empty):
            problems.append(Violation(table, f"{name}: {len(in_rows | empty)} keys, its manifest "
                                             f"recorded {manifest.get('keys')}"))
    return problems


def _schema_diff(actual: pa.Schema, expected: pa.Schema) -> str:
    parts = []
    for field in expected:
        if field.name not in actual.names:
            parts.append(f"missing column {field.name!r}")
        elif not actual.field(field.name).equals(field):
            parts.append(f"column {field.name!r} is {actual.field(field.name).type}"
                         f"{'' if actual.field(field.name).nullable else ' not null'}, "
                         f"expected {field.type}{'' if field.nullable else ' not null'}")
    parts += [f"unexpected column {n!r}" for n in actual.names if n not in expected.names]
    return "; ".join(parts) or "column order differs"


def _check_primary_key(corpus: Corpus, table: str, partition: str) -> list[Violation]:
    base = graph.base(table)
    if base == graph.ERRORS:
        return []
    columns = list(graph.PRIMARY_KEYS[base])
    try:
        data = corpus.read(table, columns=columns, partition=partition)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError):
        return []  # already reported by the file checks
    counts = data.group_by(columns).aggregate([([], "count_all")])
    dupes = counts.filter(pc.greater(counts.column("count_all"), 1)).to_pylist()
    return [Violation(table, f"duplicate key {tuple(d[c] for c in columns)} ({d['count_all']} rows)")
            for d in dupes[:LIMIT]]


def _check_lineage(corpus: Corpus, stage: str, upstream: str, downstream: str,
                   partition: str) -> list[Violation]:
    key = key_column(downstream)
    try:
        expected = pc.unique(corpus.read(upstream, columns=[key], partition=partition).column(key))
        done = corpus.done_keys(downstream, partition)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, KeyError):
        return []  # reported by the file checks
    errors = corpus.read("errors", columns=["item_id"], filter=ds.field("stage") == stage,
                         partition=partition)
    lost_mask = pc.invert(pc.or_(pc.is_in(expected, done), pc.is_in(expected, errors.column("item_id"))))
    lost = sorted(pc.filter(expected, lost_mask).to_pylist())
    problems = [Violation(downstream, f"key {k!r} of {upstream} is neither in {downstream} nor in "
                                      f"errors (stage {stage})") for k in lost[:LIMIT]]
    if len(lost) > LIMIT:
        problems.append(Violation(downstream, f"... and {len(lost) - LIMIT} more lost keys"))
    return problems
