"""``vlcorpus validate``: every table fits its schema, and no key is lost between stages."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline.errors import ErrorKind
from pipeline.storage import Corpus
from schemas.tables import SCHEMA_VERSION, key_column, schema_for

# Consecutive stages: (stage that writes the downstream table, upstream table, downstream table).
# Every upstream key must be done downstream or be in that stage's errors.
LINEAGE: list[tuple[str, str, str]] = [
    ("download", "videos", "downloads"),
    ("transcribe", "downloads", "segments"),
    ("align", "segments", "clips"),
]
# Features tables are keyed by clip; their stage name is ``featurize:<extractor>``.
FEATURES_PREFIX = "features/"

# Columns that identify a row; duplicates across batches mean a rerun duplicated work.
PRIMARY_KEYS: dict[str, list[str]] = {
    "videos": ["video_id"],
    "downloads": ["video_id"],
    "segments": ["video_id", "index"],
    "clips": ["clip_id"],
    "features": ["clip_id"],
}


@dataclass(frozen=True)
class Violation:
    table: str
    message: str

    def __str__(self) -> str:
        return f"{self.table}: {self.message}"


def validate(corpus: Corpus) -> list[Violation]:
    """All violations found under the corpus root (empty list: valid)."""
    problems: list[Violation] = []
    tables = corpus.tables()
    for table in tables:
        problems += _check_files(corpus, table)
        problems += _check_primary_key(corpus, table)
    for stage, upstream, downstream in _lineage(tables):
        problems += _check_lineage(corpus, stage, upstream, downstream)
    return problems


def _lineage(tables: list[str]) -> list[tuple[str, str, str]]:
    pairs = [p for p in LINEAGE if p[2] in tables]
    for table in tables:
        if table.startswith(FEATURES_PREFIX):
            pairs.append((f"featurize:{table[len(FEATURES_PREFIX):]}", "clips", table))
    return pairs


def _check_files(corpus: Corpus, table: str) -> list[Violation]:
    expected = schema_for(table)
    key = key_column(table)
    problems = []
    for path in corpus.table_files(table):
        name = path.rsplit("/", 1)[-1]
        with corpus.fs.open(path, "rb") as handle:
            try:
                parquet = pq.ParquetFile(handle)
                schema = parquet.schema_arrow
                data = parquet.read() if table != "errors" else parquet.read(columns=["kind"])
            except (pa.ArrowInvalid, OSError) as exc:
                problems.append(Violation(table, f"{name}: unreadable Parquet ({exc})"))
                continue
        metadata = schema.metadata or {}
        version = metadata.get(b"vlcorpus.schema_version", b"").decode()
        if version != SCHEMA_VERSION:
            problems.append(
                Violation(table, f"{name}: schema version {version or 'missing'!r}, "
                                 f"expected {SCHEMA_VERSION!r}")
            )
        if not schema.remove_metadata().equals(expected.remove_metadata()):
            diff = _schema_diff(schema, expected)
            problems.append(Violation(table, f"{name}: schema differs from schemas/: {diff}"))
            continue
        if table == "errors":
            bad = set(data.column("kind").to_pylist()) - {k.value for k in ErrorKind}
            if bad:
                problems.append(Violation(table, f"{name}: unknown error kinds {sorted(bad)}"))
            continue
        for field in expected:
            if not field.nullable and data.column(field.name).null_count:
                problems.append(Violation(table, f"{name}: nulls in column {field.name!r}"))
        manifest = corpus.file_manifest(path)
        if manifest is None:
            problems.append(Violation(table, f"{name}: no batch manifest in the footer"))
            continue
        counts = Counter(data.column(key).to_pylist())
        for item, n in sorted(manifest.items()):
            if counts.get(item, 0) != n:
                problems.append(
                    Violation(table, f"{name}: key {item!r} has {counts.get(item, 0)} rows, "
                                     f"its batch recorded {n}")
                )
        for item in sorted(set(counts) - set(manifest)):
            problems.append(Violation(table, f"{name}: key {item!r} not in its batch manifest"))
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


def _check_primary_key(corpus: Corpus, table: str) -> list[Violation]:
    columns = PRIMARY_KEYS.get(table.split("/", 1)[0])
    if not columns:
        return []
    try:
        data = corpus.read(table, columns=columns)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError):
        return []  # already reported by the file checks
    counts = data.group_by(columns).aggregate([([], "count_all")])
    dupes = counts.filter(pc.greater(counts.column("count_all"), 1)).to_pylist()
    return [
        Violation(table, f"duplicate key {tuple(d[c] for c in columns)} ({d['count_all']} rows)")
        for d in dupes[:20]
    ]


def _check_lineage(corpus: Corpus, stage: str, upstream: str, downstream: str) -> list[Violation]:
    key = key_column(downstream)
    try:
        expected = set(corpus.distinct(upstream, key))
    except (pa.ArrowInvalid, pa.ArrowTypeError, OSError, KeyError):
        return []  # reported by the file checks
    done = set(corpus.done(downstream))
    errors = corpus.read("errors", columns=["item_id"], filter=ds.field("stage") == stage)
    failed = set(errors.column("item_id").to_pylist())
    lost = sorted(expected - done - failed)
    problems = [
        Violation(downstream, f"key {k!r} of {upstream} is neither in {downstream} nor in "
                              f"errors (stage {stage})")
        for k in lost[:20]
    ]
    if len(lost) > 20:
        problems.append(Violation(downstream, f"... and {len(lost) - 20} more lost keys"))
    return problems
