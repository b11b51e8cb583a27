"""Corpus storage on any fsspec URL: atomic batch commits and tables read as pyarrow datasets.

A table is a directory of Parquet files, one per committed batch. Each file records in its
footer which item keys it completed and how many rows each produced (the batch manifest), so
"what is done" survives a kill at any moment: a batch is either fully renamed into place or
absent.
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from schemas.tables import schema_for

MANIFEST_KEY = b"vlcorpus.done"
STATS_KEY = b"vlcorpus.stats"
TMP_PREFIX = ".tmp-"


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


class Corpus:
    """One corpus root (local path or fsspec URL such as ``memory://``, ``s3://``)."""

    def __init__(self, url: str, storage_options: Mapping[str, object] | None = None) -> None:
        self.url = url
        self.fs, self.root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    @contextlib.contextmanager
    def local_file(self, path: str) -> Iterator[str]:
        """A local path for a file of the corpus, for tools that need one (ffmpeg, PyAV):
        absolute paths are outside the corpus (folder sources) and used as they are; files of
        a remote root are copied to a temporary file for the duration of the block."""
        if os.path.isabs(path):
            yield path
        elif self.is_local:
            yield self.local_path(path)
        else:
            with tempfile.TemporaryDirectory(prefix="vlcorpus-") as tmp:
                local = os.path.join(tmp, os.path.basename(path))
                self.fs.get(self.path(path), local)
                yield local

    def local_path(self, *parts: str) -> str:
        """Path usable by local tools (ffmpeg, yt-dlp); only for local roots."""
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local corpus root")
        return self.path(*parts)

    # -- writing -----------------------------------------------------------------------------
    def write_batch(
        self,
        table: str,
        rows: list[dict] | pa.Table,
        name: str,
        done: Mapping[str, int] | None = None,
        stats: Mapping[str, Mapping[str, int]] | None = None,
    ) -> str:
        """Commit one batch as ``<table>/<name>.parquet``: validated, written to a temporary
        name, then renamed, so readers never see half a batch. ``done`` maps each completed
        item key to its number of rows (items may produce none); ``stats`` holds per-item
        counters (such as drop reasons) that travel atomically with the rows."""
        data = rows_to_table(table, rows)
        metadata = dict(data.schema.metadata or {})
        if done is not None:
            metadata[MANIFEST_KEY] = json.dumps(dict(sorted(done.items()))).encode()
        if stats:
            metadata[STATS_KEY] = json.dumps(dict(sorted(stats.items()))).encode()
        data = data.replace_schema_metadata(metadata)
        directory = self.path(table)
        self.fs.makedirs(directory, exist_ok=True)
        final = posixpath.join(directory, f"{name}.parquet")
        tmp = posixpath.join(directory, f"{TMP_PREFIX}{name}-{uuid.uuid4().hex}.parquet")
        try:
            with self.fs.open(tmp, "wb") as handle:
                pq.write_table(data, handle, compression="zstd")
            self.fs.mv(tmp, final)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
            raise
        return final

    def write_text(self, relpath: str, text: str) -> str:
        """Atomically replace a small text file under the root."""
        final = self.path(relpath)
        parent = posixpath.dirname(final)
        self.fs.makedirs(parent, exist_ok=True)
        tmp = posixpath.join(parent, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        with self.fs.open(tmp, "w") as handle:
            handle.write(text)
        self.fs.mv(tmp, final)
        return final

    def sweep_temporary(self, table: str) -> int:
        """Remove temporary files left by a killed writer; returns how many."""
        directory = self.path(table)
        if not self.fs.exists(directory):
            return 0
        stale = [p for p in self.fs.ls(directory, detail=False) if _base(p).startswith(TMP_PREFIX)]
        for path in stale:
            self.fs.rm(path)
        return len(stale)

    # -- reading -----------------------------------------------------------------------------
    def tables(self) -> list[str]:
        """Names of the tables present under the root (``features/<name>`` expanded)."""
        found = []
        for name in ("videos", "downloads", "segments", "clips", "errors"):
            if self.table_files(name):
                found.append(name)
        features = self.path("features")
        if self.fs.exists(features):
            for sub in sorted(self.fs.ls(features, detail=False)):
                table = f"features/{_base(sub)}"
                if self.table_files(table):
                    found.append(table)
        return found

    def table_files(self, table: str) -> list[str]:
        directory = self.path(table)
        if not self.fs.exists(directory):
            return []
        return sorted(
            p
            for p in self.fs.ls(directory, detail=False)
            if p.endswith(".parquet") and not _base(p).startswith((".", "_"))
        )

    def dataset(self, table: str) -> ds.Dataset:
        """The table as a pyarrow dataset (empty, with the schema, when nothing is committed)."""
        schema = schema_for(table)
        files = self.table_files(table)
        if not files:
            return ds.dataset(pa.Table.from_pylist([], schema=schema))
        return ds.dataset(files, schema=schema, format="parquet", filesystem=self.fs)

    def read(
        self, table: str, columns: list[str] | None = None, filter: ds.Expression | None = None
    ) -> pa.Table:
        return self.dataset(table).to_table(columns=columns, filter=filter)

    def _footer(self, path: str, key: bytes) -> Any:
        with self.fs.open(path, "rb") as handle:
            metadata = pq.read_metadata(handle).metadata or {}
        raw = metadata.get(key)
        return None if raw is None else json.loads(raw)

    def file_manifest(self, path: str) -> dict[str, int] | None:
        """The batch manifest of one committed file, read from its footer only."""
        return self._footer(path, MANIFEST_KEY)

    def stats(self, table: str) -> dict[str, int]:
        """Per-item counters of every batch of ``table``, summed (e.g. drop reasons)."""
        totals: dict[str, int] = {}
        for path in self.table_files(table):
            for counters in (self._footer(path, STATS_KEY) or {}).values():
                for name, n in counters.items():
                    totals[name] = totals.get(name, 0) + n
        return dict(sorted(totals.items()))

    def done(self, table: str) -> dict[str, int]:
        """Every item key completed into ``table``, with its row count."""
        done: dict[str, int] = {}
        for path in self.table_files(table):
            done.update(self.file_manifest(path) or {})
        return done

    def distinct(self, table: str, column: str) -> list[str]:
        """Sorted distinct values of one column, read column-only."""
        values = self.read(table, columns=[column]).column(column)
        return sorted(v for v in pa.compute.unique(values).to_pylist() if v is not None)


def _base(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


def _protocols(fs: fsspec.AbstractFileSystem) -> Iterable[str]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else proto
