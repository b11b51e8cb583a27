"""Corpus storage on any fsspec URL: partitioned tables, atomic commits, compaction.

A table is a directory of partitions (hive layout: ``<table>/partition=00042/``), each a few
Parquet files: one per committed batch until the partition is compacted. Each file records in
its footer which item keys it completed (the batch manifest: row and key counts, and the keys
that produced no rows) and per-item counters, so "what is done" survives a kill at any moment:
a batch is either fully renamed into place or absent. Compaction merges a partition's small
files into one, whose footer lists the files it replaces: that one rename is the commit, and
the replaced files are deleted after it (or by the next sweep).

``_corpus.json`` at the root records the layout version and the number of partitions. What a
file holds (rows checked against the schema, the footer) is pipeline/corpus/tablefile.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import uuid
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from pipeline import graph
from pipeline.corpus import partitions
from pipeline.corpus.localcopy import copied_file, copied_folder
from pipeline.corpus.tablefile import (
    MANIFEST_KEY,
    REPLACES_KEY,
    batch_table,
    footer,
    footer_figures,
    merge,
    read_keys,
    rows_to_table,
)
from schemas.tables import key_column, schema_for

TMP_PREFIX = ".tmp-"
COMPACT_PREFIX = "c-"
LAYOUT_FILE = "_corpus.json"
LAYOUT_VERSION = 2
# Files under this size are merged by compaction; bigger ones are left as they are, so that a
# run adding a few videos rewrites little.
COMPACT_BELOW_BYTES = 64 * 1024 * 1024


class LayoutError(ValueError):
    """A root this version cannot use as it is: another partition count, an older layout."""


def partition_dir(label: str) -> str:
    return f"partition={label}"


class Corpus:
    """One corpus root (local path or fsspec URL such as ``memory://``, ``s3://``)."""

    def __init__(self, url: str, storage_options: Mapping[str, object] | None = None) -> None:
        self.url = url
        # Listings never come from a cache: other processes (long-lived Dask workers) compact
        # and delete files all the time, and a cached listing of an object store named files
        # that were gone, failing the next build's planning (seen on an S3 root).
        self.fs, self.root = fsspec.core.url_to_fs(url, **{"use_listings_cache": False,
                                                           **dict(storage_options or {})})
        self._partitions: int | None = None

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
            with copied_file(self.fs, self.path(path)) as local:
                yield local

    @contextlib.contextmanager
    def local_folder(self, path: str, write: bool = True) -> Iterator[str]:
        """A local folder for a folder of the corpus, for code that works on files (training and
        its checkpoints). A local root's own; for a remote root, a temporary copy of what the
        folder holds, which, with ``write``, replaces it once the block ends without an error
        (files the block deleted are deleted there too)."""
        if self.is_local:
            local = self.local_path(path)
            os.makedirs(local, exist_ok=True)
            yield local
            return
        with copied_folder(self.fs, self.path(path), write) as local:
            yield local

    def local_path(self, *parts: str) -> str:
        """Path usable by local tools (ffmpeg, yt-dlp); only for local roots."""
        if not self.is_local:
            raise ValueError(f"{self.url} is not a local corpus root")
        return self.path(*parts)

    # -- layout ------------------------------------------------------------------------------
    def recorded_partitions(self) -> int | None:
        """The partition count recorded in the root, None for a root without tables. A root
        written by an older version (flat tables) is a LayoutError naming the migration."""
        if self._partitions is None:
            layout = self.path(LAYOUT_FILE)
            if self.fs.exists(layout):
                data = json.loads(self.fs.cat(layout))
                if data.get("layout") != LAYOUT_VERSION:
                    raise LayoutError(f"{self.url}: layout version {data.get('layout')} is not "
                                      f"{LAYOUT_VERSION}; rebuild it with this version")
                self._partitions = int(data["partitions"])
            elif self._flat_tables():
                raise LayoutError(
                    f"{self.url} was written by an older vlcorpus (one folder of files per table, "
                    f"no partitions): run `vlcorpus migrate {self.url}` to move its tables into "
                    f"partitions, or build into a new root")
        return self._partitions

    def _flat_tables(self) -> bool:
        for table in graph.TABLES:
            directory = self.path(table)
            if self.fs.exists(directory) and any(
                    p.endswith(".parquet") for p in self.fs.ls(directory, detail=False)):
                return True
        return False

    def init_partitions(self, requested: int) -> int:
        """Record ``requested`` partitions in a root that has none yet; a root that has
        another number is a LayoutError (a silent remap would move videos between partitions)."""
        recorded = self.recorded_partitions()
        if recorded is not None:
            if recorded != requested:
                raise LayoutError(
                    f"{self.url} has {recorded} partitions and the config asks for {requested}: "
                    f"set execution.partitions to {recorded} (or leave it unset), or build into "
                    f"a new root")
            return recorded
        if not 1 <= requested <= partitions.MAX_PARTITIONS:
            raise ValueError(f"partitions must be between 1 and {partitions.MAX_PARTITIONS}")
        self.write_text(LAYOUT_FILE, json.dumps({"layout": LAYOUT_VERSION,
                                                 "partitions": requested}) + "\n")
        self._partitions = requested
        return requested

    @property
    def partitions(self) -> int:
        recorded = self.recorded_partitions()
        if recorded is None:
            raise LayoutError(f"{self.url} has no tables yet (no {LAYOUT_FILE})")
        return recorded

    def labels(self) -> list[str]:
        """Every partition of the corpus, in order (none before its first discover)."""
        recorded = self.recorded_partitions()
        return partitions.labels(recorded) if recorded else []

    def partition_of(self, video_id: str) -> str:
        return partitions.partition_of(video_id, self.partitions)

    # -- writing -----------------------------------------------------------------------------
    def write_batch(
        self,
        table: str,
        rows: list[dict] | pa.Table,
        name: str,
        partition: str,
        done: Iterable[str] | None = None,
        stats: Mapping[str, Mapping[str, int]] | None = None,
    ) -> str:
        """Commit one batch as ``<table>/partition=<p>/<name>.parquet``: validated, written
        under a temporary name, then renamed, so readers never see half a batch. ``done`` lists
        the item keys the batch completes (items may produce no rows); ``stats`` holds per-item
        counters (such as drop reasons) that travel atomically with the rows."""
        data = batch_table(table, rows, done, stats)
        return self.write_table(posixpath.join(table, partition_dir(partition), f"{name}.parquet"), data)

    def write_partitioned(self, table: str, rows: list[dict], name: str,
                          done: Iterable[str] | None = None) -> list[str]:
        """Commit rows of several partitions (found from their video, or their clip's video):
        one batch each."""
        def video(value: dict | str) -> str:
            if isinstance(value, dict):
                if "clip_id" in value or "video_id" in value:
                    return value.get("video_id") or partitions.video_of_clip(value["clip_id"])
                return value["item_id"]  # an errors row of a video
            return partitions.video_of_clip(value) if key_column(table) == "clip_id" else value

        by_partition: dict[str, list[dict]] = {}
        for row in rows:
            by_partition.setdefault(self.partition_of(video(row)), []).append(row)
        keys: dict[str, set[str]] = {}
        for key in done or ():
            keys.setdefault(self.partition_of(video(key)), set()).add(key)
        return [self.write_batch(table, by_partition.get(p, []), name, p,
                                 None if done is None else keys.get(p, set()))
                for p in sorted(set(by_partition) | set(keys))]

    @contextlib.contextmanager
    def atomic_file(self, relpath: str, mode: str = "wb") -> Iterator[Any]:
        """A file under the root written all or nothing: the block writes a temporary file in
        the same folder (invisible to readers), renamed into place when the block ends; on any
        failure the temporary file is removed and the old file, if any, is left as it was."""
        final = self.path(relpath)
        directory = posixpath.dirname(final)
        self.fs.makedirs(directory, exist_ok=True)
        tmp = posixpath.join(directory, f"{TMP_PREFIX}{uuid.uuid4().hex}")
        try:
            with self.fs.open(tmp, mode) as handle:
                yield handle
            self.fs.mv(tmp, final)
        except BaseException:
            if self.fs.exists(tmp):
                self.fs.rm(tmp)
            raise

    def write_table(self, relpath: str, data: pa.Table, row_group_size: int | None = None) -> str:
        """Atomically write a Parquet file under the root."""
        with self.atomic_file(relpath) as handle:
            pq.write_table(data, handle, compression="zstd", row_group_size=row_group_size)
        return self.path(relpath)

    def write_text(self, relpath: str, text: str) -> str:
        """Atomically replace a small text file under the root."""
        with self.atomic_file(relpath, "w") as handle:
            handle.write(text)
        return self.path(relpath)

    def _relative(self, path: str) -> str:
        return posixpath.relpath(path, self.root)

    def read_json(self, relpath: str) -> Any:
        """A JSON file under the root, None when it does not exist."""
        path = self.path(relpath)
        return json.loads(self.fs.cat(path)) if self.fs.exists(path) else None

    def compact(self, table: str, partition: str, below_bytes: int = COMPACT_BELOW_BYTES) -> str | None:
        """Merge the partition's files smaller than ``below_bytes`` into one (rows sorted by the
        table's primary key, manifests and counters merged); None when there is nothing to merge."""
        directory = self.path(table, partition_dir(partition))
        present = self._present(directory)
        live = self._live(directory, present)
        small = [name for name in live if present[name] < below_bytes]
        if len(small) < 2:
            return None
        big = set(live) - set(small)
        return self._rewrite(table, directory, [n for n in present if n not in big],
                             [posixpath.join(directory, n) for n in small])

    def replace_rows(self, table: str, partition: str, rows: list[dict] | pa.Table,
                     done: Iterable[str]) -> str:
        """Commit rows that replace the partition's rows with the same keys (one rewrite of the
        partition: for small tables, e.g. a download done again after its media was dropped)."""
        new = rows_to_table(table, rows)
        directory = self.path(table, partition_dir(partition))
        present = self._present(directory)
        live = [posixpath.join(directory, n) for n in self._live(directory, present)]
        return self._rewrite(table, directory, list(present), live, new, set(done))

    def _rewrite(self, table: str, directory: str, replaces: list[str], sources: list[str],
                 new: pa.Table | None = None, new_done: set[str] | None = None) -> str:
        """Commit the merge of ``sources`` (and ``new``) as one file named for what it
        replaces, then delete the replaced files (a kill before that leaves them to sweep)."""
        merged = merge(self.fs, table, sources, replaces, new, new_done)
        digest = hashlib.sha1("\n".join(sorted(replaces)).encode()).hexdigest()[:20]
        final = self.write_table(posixpath.join(self._relative(directory), f"{COMPACT_PREFIX}{digest}.parquet"),
                                 merged, row_group_size=4096)
        for name in replaces:
            with contextlib.suppress(FileNotFoundError):
                self.fs.rm(posixpath.join(directory, name))
        return final

    def sweep(self, table: str, partition: str) -> int:
        """Remove what killed writers left in a partition (temporary files, files a compaction
        replaced); returns how many."""
        directory = self.path(table, partition_dir(partition))
        if not self.fs.exists(directory):
            return 0
        names = [_base(p) for p in self.fs.ls(directory, detail=False)]
        present = self._present(directory)
        live = set(self._live(directory, present))
        stale = [n for n in names if n.startswith(TMP_PREFIX) or (n in present and n not in live)]
        for name in stale:
            self.fs.rm(posixpath.join(directory, name))
        return len(stale)

    # -- reading -----------------------------------------------------------------------------
    def tables(self) -> list[str]:
        """Names of the tables present under the root (families such as ``features/<name>``
        and ``scores/<model>`` expanded)."""
        found = [t for t in graph.TABLES if t != graph.ERRORS and self.fs.exists(self.path(t))]
        for family in graph.FAMILIES:
            found += self.family_tables(family)
        if self.fs.exists(self.path(graph.ERRORS)):
            found.append(graph.ERRORS)
        return found

    def family_tables(self, family: str) -> list[str]:
        """The tables of one family present under the root (``features/resnet34``, ...)."""
        directory = self.path(family)
        if not self.fs.exists(directory):
            return []
        return [f"{family}/{_base(sub)}" for sub in sorted(self.fs.ls(directory, detail=False))
                if not _base(sub).startswith((".", "_"))]

    def partitions_of(self, table: str) -> list[str]:
        """Partitions of ``table`` that hold files."""
        directory = self.path(table)
        if not self.fs.exists(directory):
            return []
        prefix = "partition="
        return sorted(_base(p)[len(prefix):] for p in self.fs.ls(directory, detail=False)
                      if _base(p).startswith(prefix))

    def _present(self, directory: str) -> dict[str, int]:
        """Committed Parquet files of a partition directory (live or replaced), with sizes."""
        if not self.fs.exists(directory):
            return {}
        return {_base(e["name"]): int(e.get("size") or 0)
                for e in self.fs.ls(directory, detail=True)
                if e["name"].endswith(".parquet") and not _base(e["name"]).startswith((".", "_"))}

    def _live(self, directory: str, present: Mapping[str, int]) -> list[str]:
        """The files that hold the partition's rows: those no compacted file replaces."""
        replaced: set[str] = set()
        for name in present:
            if name.startswith(COMPACT_PREFIX):
                with contextlib.suppress(FileNotFoundError):
                    replaced |= set(footer(self.fs, posixpath.join(directory, name), REPLACES_KEY) or [])
        return sorted(name for name in present if name not in replaced)

    def table_files(self, table: str, partition: str | None = None) -> list[str]:
        """The live files of one partition of ``table``, or of every partition."""
        chosen = [partition] if partition is not None else self.partitions_of(table)
        files = []
        for label in chosen:
            directory = self.path(table, partition_dir(label))
            files += [posixpath.join(directory, n) for n in self._live(directory, self._present(directory))]
        return files

    def dataset(self, table: str, partition: str | None = None) -> ds.Dataset:
        """The table (or one partition of it) as a pyarrow dataset (empty, with the schema,
        when nothing is committed)."""
        schema = schema_for(table)
        files = self.table_files(table, partition)
        if not files:
            return ds.dataset(schema.empty_table())
        return ds.dataset(files, schema=schema, format="parquet", filesystem=self.fs)

    def read(self, table: str, columns: list[str] | dict[str, ds.Expression] | None = None,
             filter: ds.Expression | None = None, partition: str | None = None) -> pa.Table:
        return self.dataset(table, partition).to_table(columns=columns, filter=filter)

    def file_manifest(self, path: str) -> dict[str, Any] | None:
        """The batch manifest of one committed file, read from its footer only."""
        return footer(self.fs, path, MANIFEST_KEY)

    def stats(self, table: str, partition: str | None = None) -> dict[str, int]:
        """Per-item counters of ``table`` (or one partition), summed (e.g. drop reasons)."""
        return self._figures(self.table_files(table, partition))["stats"]

    def figures(self, table: str, partition: str) -> dict[str, Any] | None:
        """One partition of ``table``: ``{"rows": n, "stats": {counter: n}}``, from one read of
        each live file's footer; None when the partition holds no file of the table."""
        files = self.table_files(table, partition)
        return self._figures(files) if files else None

    def _figures(self, paths: list[str]) -> dict[str, Any]:
        rows, totals = 0, {}
        for path in paths:
            n, counters = footer_figures(self.fs, path)
            rows += n
            for name, count in counters.items():
                totals[name] = totals.get(name, 0) + count
        return {"rows": rows, "stats": dict(sorted(totals.items()))}

    def done_keys(self, table: str, partition: str) -> pa.Array:
        """Every item key completed into one partition of ``table``, as a string array."""
        key = key_column(table)
        arrays = [pa.array([], pa.string())]
        for path in self.table_files(table, partition):
            column, empty = read_keys(self.fs, path, key)
            arrays += [column.combine_chunks(), pa.array(empty, pa.string())]
        return pc.unique(pa.concat_arrays([a.cast(pa.string()) for a in arrays]))

    def done(self, table: str, partition: str | None = None) -> dict[str, int]:
        """Every item key completed into ``table`` with its row count: for small corpora and
        checks (planning uses ``done_keys`` partition by partition)."""
        chosen = [partition] if partition is not None else self.partitions_of(table)
        key = key_column(table)
        counts: dict[str, int] = {}
        for label in chosen:
            for path in self.table_files(table, label):
                column, empty = read_keys(self.fs, path, key)
                for entry in pc.value_counts(column).to_pylist():
                    counts[entry["values"]] = counts.get(entry["values"], 0) + entry["counts"]
                for k in empty:
                    counts.setdefault(k, 0)
        return dict(sorted(counts.items()))

    def distinct(self, table: str, column: str, partition: str | None = None) -> list[str]:
        """Sorted distinct values of one column, read column-only."""
        values = self.read(table, columns=[column], partition=partition).column(column)
        return sorted(v for v in pc.unique(values).to_pylist() if v is not None)


def _base(path: str) -> str:
    return posixpath.basename(path.rstrip("/"))


def _protocols(fs: fsspec.AbstractFileSystem) -> Iterable[str]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else proto
