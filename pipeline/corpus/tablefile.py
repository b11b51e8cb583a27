"""One committed Parquet file of a table: rows checked against the table's schema, and a footer
that makes the file its own record of what it committed. The footer holds the batch manifest
(row and key counts, and the keys that produced no rows), per-item counters (such as drop
reasons), and, for a compacted file, the files it replaces. Where files go and how they are
committed atomically is the Corpus's business (pipeline/corpus/storage.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline import graph
from schemas.tables import key_column, schema_for

MANIFEST_KEY = b"vlcorpus.done"
STATS_KEY = b"vlcorpus.stats"
REPLACES_KEY = b"vlcorpus.replaces"


class SchemaViolation(ValueError):
    """Rows that do not fit their table's schema."""


def rows_to_table(table: str, rows: list[dict] | pa.Table) -> pa.Table:
    """Validate rows against the table schema and return them as an Arrow table."""
    schema = schema_for(table)
    if isinstance(rows, pa.Table):
        if rows.schema.names != schema.names:
            raise SchemaViolation(f"{table}: columns {rows.schema.names} != {schema.names}")
        try:
            data = rows.cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
            raise SchemaViolation(f"{table}: {exc}") from exc
    else:
        allowed = set(schema.names)
        for row in rows:
            extra = set(row) - allowed
            if extra:
                raise SchemaViolation(f"{table}: unknown columns {sorted(extra)}")
        try:
            data = pa.Table.from_pylist(rows, schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise SchemaViolation(f"{table}: {exc}") from exc
    for field in schema:
        if not field.nullable and data.column(field.name).null_count:
            raise SchemaViolation(f"{table}: column {field.name!r} must not be null")
    data.validate(full=True)
    return data


def batch_table(table: str, rows: list[dict] | pa.Table, done: Iterable[str] | None = None,
                stats: Mapping[str, Mapping[str, int]] | None = None) -> pa.Table:
    """The rows of one batch, checked, with its footer: the manifest when ``done`` lists the
    keys it completes (items may produce no rows), and the per-item counters ``stats``."""
    data = rows_to_table(table, rows)
    metadata = dict(data.schema.metadata or {})
    if done is not None:
        metadata[MANIFEST_KEY] = _manifest(data, table, set(done))
    if stats:
        metadata[STATS_KEY] = _encode_stats(stats)
    return data.replace_schema_metadata(metadata)


def _manifest(data: pa.Table, table: str, done: set[str]) -> bytes:
    """Rows, keys, and the keys that produced no rows (those the key column cannot show)."""
    in_rows = set(pc.unique(data.column(key_column(table))).to_pylist())
    stray = in_rows - done
    if stray:
        raise SchemaViolation(f"{table}: rows of keys the batch does not complete: {sorted(stray)[:5]}")
    return json.dumps({"rows": data.num_rows, "keys": len(done),
                       "empty": sorted(done - in_rows)}).encode()


def _encode_stats(stats: Mapping[str, Mapping[str, int]]) -> bytes:
    """Per-item counters as footer metadata, keys sorted so equal batches are equal bytes."""
    return json.dumps(dict(sorted(stats.items()))).encode()


def footer(fs: fsspec.AbstractFileSystem, path: str, key: bytes) -> Any:
    """One entry of a file's footer, decoded; None when the file has none. Reads no rows."""
    with fs.open(path, "rb") as handle:
        metadata = pq.read_metadata(handle).metadata or {}
    raw = metadata.get(key)
    return None if raw is None else json.loads(raw)


def footer_figures(fs: fsspec.AbstractFileSystem, path: str) -> tuple[int, dict[str, int]]:
    """A file's row count and its per-item counters summed, from one read of its footer."""
    with fs.open(path, "rb") as handle:
        metadata = pq.read_metadata(handle)
    totals: dict[str, int] = {}
    for counters in json.loads((metadata.metadata or {}).get(STATS_KEY, b"{}")).values():
        for name, n in counters.items():
            totals[name] = totals.get(name, 0) + n
    return metadata.num_rows, totals


def read_keys(fs: fsspec.AbstractFileSystem, path: str, key: str) -> tuple[pa.ChunkedArray, list[str]]:
    """A file's key column, and the keys its manifest completes without rows."""
    with fs.open(path, "rb") as handle:
        parquet = pq.ParquetFile(handle)
        column = parquet.read(columns=[key]).column(key)
        raw = (parquet.schema_arrow.metadata or {}).get(MANIFEST_KEY)
    return column, json.loads(raw).get("empty", []) if raw else []


def merge(fs: fsspec.AbstractFileSystem, table: str, sources: Iterable[str], replaces: list[str],
          new: pa.Table | None = None, new_done: set[str] | None = None) -> pa.Table:
    """The rows of ``sources`` (and ``new``, whose keys ``new_done`` replace theirs) as one
    table sorted by the primary key, with their manifests and counters merged and the names
    of the files it ``replaces`` in its footer: what compaction writes."""
    schema = schema_for(table)
    key = key_column(table)
    parts, empty, stats, manifests = [], set(), {}, False
    dropped = set(new_done or ())
    for path in sources:
        with fs.open(path, "rb") as handle:
            parquet = pq.ParquetFile(handle)
            meta = parquet.schema_arrow.metadata or {}
            data = parquet.read().cast(schema)
        if MANIFEST_KEY in meta:
            manifests = True
            empty |= set(json.loads(meta[MANIFEST_KEY]).get("empty", []))
        stats.update(json.loads(meta.get(STATS_KEY, b"{}")))
        if dropped:
            data = data.filter(pc.invert(pc.is_in(data.column(key), pa.array(sorted(dropped)))))
        parts.append(data.replace_schema_metadata(schema.metadata))
    if new is not None:
        parts.append(new)
        manifests = True
        for k in dropped:
            stats.pop(k, None)
    merged = pa.concat_tables(parts) if parts else schema.empty_table()
    order = [(c, "ascending") for c in graph.PRIMARY_KEYS[graph.base(table)]]
    merged = merged.sort_by(order)
    metadata = dict(schema.metadata)
    if manifests:
        keys_in_rows = set(pc.unique(merged.column(key)).to_pylist())
        metadata[MANIFEST_KEY] = _manifest(merged, table, keys_in_rows | (empty - dropped) | dropped)
    if stats:
        metadata[STATS_KEY] = _encode_stats(stats)
    metadata[REPLACES_KEY] = json.dumps(sorted(replaces)).encode()
    return merged.replace_schema_metadata(metadata)
