"""``vlcorpus validate``: every table fits its schema, every row is in its video's partition,
no key is lost between stages (the lineage of pipeline/graph.py), and every shard is as its
partition index recorded it (pipeline/shards/verify.py). Checked partition by partition, each
table file read once, several partitions at a time; the violations come in table and partition
order all the same."""

from __future__ import annotations

import json
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import graph
from pipeline.corpus import partitions
from pipeline.errors import ErrorKind
from pipeline.corpus.partsummary import WORKERS
from pipeline.corpus.rootlock import RootLock
from pipeline.shards.verify import Damage, check_shards, take_out
from pipeline.corpus.storage import Corpus, LayoutError
from pipeline.corpus.tablefile import MANIFEST_KEY
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
    """All violations found under the corpus root (empty list: valid), in table and partition
    order; shards are checked by size, and by sha256 unless ``hashes`` is False."""
    try:
        count = corpus.recorded_partitions()
    except LayoutError as exc:
        return [Violation("(root)", str(exc))]
    tables = corpus.tables()
    labels = sorted(corpus.labels())
    lineage = _lineage(tables)

    def check(partition: str) -> _Found:
        here = [t for t in tables if partition in held[t]]
        return _check_partition(corpus, here, lineage, partition, partition != partitions.CORPUS)

    # Partitions are checked concurrently (an object store answers each read slowly), each by
    # one thread: memory follows the partitions in flight, not the corpus.
    with ThreadPoolExecutor(WORKERS) as pool:
        held = dict(zip(tables, pool.map(corpus.partitions_of, tables)))
        checked = labels + ([partitions.CORPUS] if any(partitions.CORPUS in held[t] for t in tables) else [])
        found = dict(zip(checked, pool.map(check, checked)))
    problems: list[Violation] = []
    for table in tables:
        for partition in held[table]:
            if partition in found:
                problems += found[partition].tables[table]
            else:
                problems.append(Violation(table, f"partition {partition!r} is not one of the "
                                                 f"corpus's {count} partitions"))
    for pair in lineage:
        for partition in labels:
            problems += found[partition].lineage[pair]
    problems += [ShardViolation("shards", str(d), d) for d in check_shards(corpus, labels, hashes)]
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


def _kept(table: str, lineage: list[tuple[str, str, str]]) -> pa.Schema:
    """The columns of ``table`` that its key check and the lineage checks need, typed as schemas/."""
    if table == graph.ERRORS:
        names = ["stage", "item_id"]
    else:
        names = [*graph.PRIMARY_KEYS[graph.base(table)], key_column(table)]
        names += [key_column(down) for _, up, down in lineage if up == table]
    expected = schema_for(table)
    return pa.schema([pa.field(n, expected.field(n).type) for n in dict.fromkeys(names)])


@dataclass(frozen=True)
class _Read:
    """One table in one partition: what the file checks found, the ``_kept`` columns of all its
    rows (None where a file is unreadable or does not cast to schemas/: those checks are left to
    the file checks' report) and the keys its manifests complete without rows."""
    problems: list[Violation]
    keys: pa.Table | None
    empty: list[str]


@dataclass(frozen=True)
class _Found:
    tables: dict[str, list[Violation]]  # table -> its file and key checks in the partition
    lineage: dict[tuple[str, str, str], list[Violation]]


def _check_partition(corpus: Corpus, here: list[str], lineage: list[tuple[str, str, str]],
                     partition: str, labelled: bool) -> _Found:
    """The checks of one partition, each of its table files read once (the columns the checks
    need, not the feature values nor the words). ``here``: the tables that hold the partition;
    lineage only for the corpus's partitions (``labelled``)."""
    pairs = lineage if labelled else []
    needed = [*here, *(t for p in pairs for t in p[1:]), *([graph.ERRORS] if pairs else [])]
    reads = {t: _read(corpus, t, partition, _kept(t, lineage)) if t in here
             else _Read([], _kept(t, lineage).empty_table(), []) for t in dict.fromkeys(needed)}
    return _Found({t: reads[t].problems + _duplicate_keys(t, reads[t].keys) for t in here},
                  {pair: _lost_keys(*pair, reads) for pair in pairs})


def _read(corpus: Corpus, table: str, partition: str, kept: pa.Schema) -> _Read:
    expected = schema_for(table)
    columns = ["kind", *kept.names] if table == graph.ERRORS else [
        f.name for f in expected if f.name not in ("values", "words")]
    problems: list[Violation] = []
    parts: list[pa.Table | None] = []
    empty: list[str] = []
    for path in corpus.table_files(table, partition):
        name = f"partition={partition}/{posixpath.basename(path)}"
        with corpus.fs.open(path, "rb") as handle:
            try:
                parquet = pq.ParquetFile(handle)
                schema = parquet.schema_arrow
                data = parquet.read(columns=columns)
            except (pa.ArrowInvalid, OSError) as exc:
                problems.append(Violation(table, f"{name}: unreadable Parquet ({exc})"))
                parts.append(None)
                continue
        raw = (schema.metadata or {}).get(MANIFEST_KEY)
        manifest = None if raw is None else json.loads(raw)
        problems += _check_file(table, partition, corpus.partitions, name, schema, data, manifest)
        empty += (manifest or {}).get("empty", [])
        parts.append(_cast(data, kept))
    keys = None if any(p is None for p in parts) else pa.concat_tables([kept.empty_table(), *parts])
    return _Read(problems, keys, empty)


def _cast(data: pa.Table, kept: pa.Schema) -> pa.Table | None:
    """The ``kept`` columns of a file's rows as a dataset with the table's schema reads them:
    cast to its types, absent ones null; None when one does not cast."""
    try:
        return pa.table([data.column(f.name).cast(f.type) if f.name in data.column_names
                         else pa.nulls(data.num_rows, f.type) for f in kept], schema=kept)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


def _video_ids(data: pa.Table) -> list[str]:
    if "video_id" in data.column_names:
        return data.column("video_id").to_pylist()
    return [partitions.video_of_clip(c) for c in data.column("clip_id").to_pylist()]


def _check_file(table: str, partition: str, count: int, name: str, schema: pa.Schema, data: pa.Table,
                manifest: dict[str, Any] | None) -> list[Violation]:
    """One file of ``table`` (``data``: the columns read of it) against schemas/, its partition
    (of ``count``) and its batch manifest."""
    expected = schema_for(table)
    problems = []
    version = (schema.metadata or {}).get(b"vlcorpus.schema_version", b"").decode()
    if version != SCHEMA_VERSION:
        problems.append(Violation(table, f"{name}: schema version {version or 'missing'!r}, "
                                         f"expected {SCHEMA_VERSION!r}"))
    if not schema.remove_metadata().equals(expected.remove_metadata()):
        diff = _schema_diff(schema, expected)
        return problems + [Violation(table, f"{name}: schema differs from schemas/: {diff}")]
    if table == graph.ERRORS:
        bad = set(data.column("kind").to_pylist()) - {k.value for k in ErrorKind}
        if bad:
            problems.append(Violation(table, f"{name}: unknown error kinds {sorted(bad)}"))
        return problems
    for field in expected:
        if field.name in data.column_names and not field.nullable and data.column(field.name).null_count:
            problems.append(Violation(table, f"{name}: nulls in column {field.name!r}"))
    elsewhere = sorted({v for v in _video_ids(data) if partitions.partition_of(v, count) != partition})
    if elsewhere:
        problems.append(Violation(table, f"{name}: rows of videos of other partitions: "
                                         f"{elsewhere[:5]}"))
    if manifest is None:
        return problems + [Violation(table, f"{name}: no batch manifest in the footer")]
    in_rows = set(pc.unique(data.column(key_column(table))).to_pylist())
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


def _duplicate_keys(table: str, keys: pa.Table | None) -> list[Violation]:
    if graph.base(table) == graph.ERRORS or keys is None:  # None: reported by the file checks
        return []
    columns = list(graph.PRIMARY_KEYS[graph.base(table)])
    counts = keys.select(columns).group_by(columns).aggregate([([], "count_all")])
    dupes = counts.filter(pc.greater(counts.column("count_all"), 1)).to_pylist()
    return [Violation(table, f"duplicate key {tuple(d[c] for c in columns)} ({d['count_all']} rows)")
            for d in dupes[:LIMIT]]


def _lost_keys(stage: str, upstream: str, downstream: str, reads: dict[str, _Read]) -> list[Violation]:
    up, down, errors = reads[upstream].keys, reads[downstream], reads[graph.ERRORS].keys
    if up is None or down.keys is None or errors is None:
        return []  # reported by the file checks
    key = key_column(downstream)
    expected = pc.unique(up.column(key))
    done = pa.concat_arrays([down.keys.column(key).combine_chunks(), pa.array(down.empty, pa.string())])
    failed = errors.filter(pc.equal(errors.column("stage"), stage)).column("item_id")
    lost_mask = pc.invert(pc.or_(pc.is_in(expected, done), pc.is_in(expected, failed)))
    lost = sorted(pc.filter(expected, lost_mask).to_pylist())
    problems = [Violation(downstream, f"key {k!r} of {upstream} is neither in {downstream} nor in "
                                      f"errors (stage {stage})") for k in lost[:LIMIT]]
    if len(lost) > LIMIT:
        problems.append(Violation(downstream, f"... and {len(lost) - LIMIT} more lost keys"))
    return problems
