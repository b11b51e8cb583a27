"""Per-partition summaries: what the corpus-wide readers (status, the summary, the report, a
build's choice of partitions with work) need from one partition, kept small under
``_summaries/partition=<label>.json`` so that they need not read every file of every table.

A summary is derived from the partition's files and records their fingerprint: the name, size
and version (ETag or mtime) of every committed file of the partition in every table and of its
shard index. It is never trusted when the files differ: a reader lists the tables (one
recursive listing per table, not one request per file), compares, and rescans only the
partitions whose summary is missing or stale. So a kill between a batch's commit and its
summary's write costs a rescan, never a wrong figure. A summary is made of sections (the
summary's, the report's, status's), each computed by its owner from the partition's tables;
a section may carry a key of what else it depends on (status: the config).

Reads and rescans that touch many objects run concurrently (``WORKERS`` threads).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import posixpath
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipeline import graph
from pipeline.shards.index import INDEX_DIR
from pipeline.corpus.storage import Corpus, partition_dir

SUMMARY_DIR = "_summaries"
FORMAT = 1
WORKERS = 16
# A compaction may delete a listed file before it is read: list and read again, this often.
READ_TRIES = 5
_PREFIX = "partition="
_INDEX_PREFIX = "p"

# A section: the partition's figures of one reader, computed from its tables.
Section = Callable[[Corpus, str], Any]


def summary_path(partition: str) -> str:
    return f"{SUMMARY_DIR}/{partition_dir(partition)}.json"


def _version(entry: Mapping[str, Any]) -> str:
    """What changes when a file is rewritten under the same name and size."""
    for field in ("ETag", "etag", "mtime", "LastModified", "created"):
        if entry.get(field) is not None:
            return str(entry[field])
    return ""


def _committed(name: str) -> bool:
    base = posixpath.basename(name)
    return base.endswith(".parquet") and not base.startswith((".", "_"))


def _partition_of(relpath: str) -> str | None:
    """The partition a table file or shard index belongs to, from its path."""
    parts = relpath.split("/")
    for part in parts[:-1]:
        if part.startswith(_PREFIX):
            return part[len(_PREFIX):]
    if posixpath.dirname(relpath) == INDEX_DIR and parts[-1].startswith(_INDEX_PREFIX):
        return parts[-1][len(_INDEX_PREFIX):-len(".parquet")]
    return None


def _tops() -> list[str]:
    """The folders that hold partition files: every table (families whole) and the shard index."""
    return [*graph.TABLES, *graph.FAMILIES, INDEX_DIR]


def _find(corpus: Corpus, folder: str) -> list[dict[str, Any]]:
    path = corpus.path(folder)
    if corpus.is_local:
        return _walk(path)
    try:
        found = corpus.fs.find(path, detail=True)
    except FileNotFoundError:
        return []
    return [entry for entry in found.values() if entry.get("type", "file") == "file"]


def _walk(path: str) -> list[dict[str, Any]]:
    """The files under a local folder as fsspec's ``find`` details them (name, size, mtime),
    from ``os.scandir``: fsspec's walk of a local folder lists and stats each entry in Python,
    about 0.7 CPU-s for every partition's files at 2048 partitions, where this takes 0.15."""
    found: list[dict[str, Any]] = []
    folders = [path]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_dir():
                        folders.append(entry.path)
                    elif entry.is_file():
                        stat = entry.stat()
                        found.append({"name": entry.path, "size": stat.st_size, "mtime": stat.st_mtime,
                                      "type": "file"})
        except FileNotFoundError:  # not made yet (a table no build wrote), or gone since listed
            continue
    return found


def _digest(entries: Iterable[tuple[str, int, str]]) -> str:
    return hashlib.sha1(json.dumps(sorted(entries)).encode()).hexdigest()


def _group(corpus: Corpus, entries: Iterable[Mapping[str, Any]],
           only: str | None = None) -> dict[str, list[tuple[str, int, str]]]:
    files: dict[str, list[tuple[str, int, str]]] = {}
    for entry in entries:
        relpath = posixpath.relpath(entry["name"], corpus.root)
        label = _partition_of(relpath)
        if label is None or not _committed(relpath) or (only is not None and label != only):
            continue
        files.setdefault(label, []).append((relpath, int(entry.get("size") or 0), _version(entry)))
    return files


# The fingerprint of a partition without files.
EMPTY = _digest([])


def fingerprints(corpus: Corpus, pool: ThreadPoolExecutor, folders: list[str] | None = None) -> dict[str, str]:
    """Every partition's fingerprint, from one recursive listing per table folder (of ``folders``,
    such as the tables training reads; by default every table and the shard index)."""
    files: dict[str, list[tuple[str, int, str]]] = {}
    for found in pool.map(lambda folder: _find(corpus, folder), _tops() if folders is None else folders):
        for label, entries in _group(corpus, found).items():
            files.setdefault(label, []).extend(entries)
    return {label: _digest(entries) for label, entries in files.items()}


def fingerprint(corpus: Corpus, partition: str) -> str:
    """One partition's fingerprint, listing only its own folders (what ``fingerprints`` gives it)."""
    folders = [posixpath.join(t, partition_dir(partition)) for t in graph.TABLES]
    for family in graph.FAMILIES:
        folders += [posixpath.join(t, partition_dir(partition)) for t in corpus.family_tables(family)]
    entries = [e for folder in folders for e in _find(corpus, folder)]
    index = corpus.path(INDEX_DIR, f"{_INDEX_PREFIX}{partition}.parquet")
    with contextlib.suppress(FileNotFoundError):  # a partition with no shards has no index file
        entries.append(corpus.fs.info(index))
    return _digest(_group(corpus, entries, only=partition).get(partition, []))


def _load(corpus: Corpus, labels: list[str]) -> dict[str, dict[str, Any]]:
    """The stored summaries of ``labels`` (those that exist), fetched concurrently."""
    folder = corpus.path(SUMMARY_DIR)
    try:
        present = {posixpath.basename(p) for p in corpus.fs.ls(folder, detail=False)}
    except FileNotFoundError:
        return {}
    paths = {corpus.path(summary_path(label)): label for label in labels
             if posixpath.basename(summary_path(label)) in present}
    if not paths:
        return {}
    # fsspec's cat of many paths fetches them concurrently on object stores.
    raw = corpus.fs.cat(list(paths), on_error="omit")
    stored = {}
    for path, data in raw.items():
        label = paths.get(path) or paths.get(corpus.fs._strip_protocol(path))
        try:
            doc = json.loads(data)
        except ValueError:  # a torn write of an older version: rescanned
            continue
        if label is not None and doc.get("format") == FORMAT:
            stored[label] = doc
    return stored


def _fresh(doc: Mapping[str, Any] | None, print_: str, name: str, key: str) -> bool:
    if doc is None or doc.get("fingerprint") != print_:
        return False
    section = doc.get("sections", {}).get(name)
    return section is not None and section.get("key") == key


def _rescan(corpus: Corpus, partition: str, sections: Mapping[str, Section],
            keys: Mapping[str, str], old: Mapping[str, Any] | None, write: bool) -> dict[str, Any]:
    """The partition's sections from its tables, under the fingerprint taken before reading;
    with ``write``, stored (with the sections of ``old`` that are still fresh)."""
    for attempt in range(1, READ_TRIES + 1):
        print_ = fingerprint(corpus, partition)
        try:
            values = {name: section(corpus, partition) for name, section in sections.items()}
            break
        except FileNotFoundError:
            # A compaction committed and deleted the files it replaced after they were listed.
            if attempt == READ_TRIES:
                raise
            time.sleep(0.05 * attempt)
    kept = dict(old.get("sections", {})) if old and old.get("fingerprint") == print_ else {}
    kept.update({name: {"key": keys.get(name, ""), "value": v} for name, v in values.items()})
    if write:
        doc = {"format": FORMAT, "fingerprint": print_, "sections": kept}
        corpus.write_text(summary_path(partition), json.dumps(doc, sort_keys=True, default=str) + "\n")
    return values


def gather(corpus: Corpus, sections: Mapping[str, Section], labels: list[str] | None = None,
           keys: Mapping[str, str] | None = None, write: bool = False,
           rescan: bool = True, prints: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """``{partition: {section: value}}`` for ``labels`` (every partition that holds files, by
    default): stored values where the partition's files are those they were computed from,
    the rest rescanned concurrently (with ``write``, and stored). Without ``rescan`` the
    partitions with a missing or stale summary are left out. ``prints``: the partitions'
    fingerprints, for a caller that took them already."""
    keys = dict(keys or {})
    with ThreadPoolExecutor(WORKERS) as pool:
        prints = fingerprints(corpus, pool) if prints is None else prints
        chosen = sorted(prints) if labels is None else list(labels)
        stored = _load(corpus, chosen)
        out: dict[str, dict[str, Any]] = {}
        stale: dict[str, dict[str, Section]] = {}
        for label in chosen:
            doc = stored.get(label)
            for name, section in sections.items():
                if _fresh(doc, prints.get(label, EMPTY), name, keys.get(name, "")):
                    out.setdefault(label, {})[name] = doc["sections"][name]["value"]
                else:
                    stale.setdefault(label, {})[name] = section
        if rescan and stale:
            jobs = {label: pool.submit(_rescan, corpus, label, wanted, keys, stored.get(label), write)
                    for label, wanted in stale.items()}
            for label, job in jobs.items():
                out.setdefault(label, {}).update(job.result())
    return out


def refresh(corpus: Corpus, partition: str, sections: Mapping[str, Section],
            keys: Mapping[str, str] | None = None) -> None:
    """Rescan one partition and store its summary: what a build does once a partition's
    chain of stages is over."""
    _rescan(corpus, partition, sections, dict(keys or {}), None, write=True)
