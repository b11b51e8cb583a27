"""What each config source lists: its queries, and the rows each query yields.

Searches and playlists are listed with yt-dlp's flat extraction (no media requests); URL and id
lists and local folders are read without touching the network.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import posixpath
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow.parquet as pq

from pipeline.config import (
    Config,
    FolderSource,
    ListSource,
    PlaylistSource,
    SearchSource,
    Source,
    UrlsSource,
)
from pipeline.discover.rows import BadRecord, Known, known_number, row_from_entry, row_from_url, video_row
from pipeline.errors import BadInputError
from pipeline.ids import safe_id
from pipeline.progress import log
from pipeline.download.ytdlp import base_options, extract


@dataclass(frozen=True)
class Query:
    """One unit of discovery: a search, a playlist, a list file, inline URLs or a folder."""

    key: str  # item_id in the errors table
    kind: str  # the source type
    target: str  # the search text, URL or path
    source: Source


def queries(cfg: Config) -> list[Query]:
    """Every query the sources expand to, in config order."""
    out: list[Query] = []
    for source in cfg.sources:
        match source:
            case SearchSource():
                for text in source.expanded_queries():
                    out.append(Query(f"search:{text}", "search", text, source))
            case PlaylistSource():
                out += [Query(f"playlist:{url}", "playlist", url, source) for url in source.urls]
            case ListSource():
                out.append(Query(f"list:{source.path}", "list", source.path, source))
            case UrlsSource():
                out += [Query(f"url:{url}", "urls", url, source) for url in source.urls]
            case FolderSource():
                out.append(Query(f"folder:{source.path}", "folder", source.path, source))
    return out


def list_query(query: Query, cfg: Config, known: Known | None = None) -> Iterable[dict[str, Any] | BadRecord]:
    """The videos rows one query yields (before dedup, scheme checks and filters), and the
    records of a list that name no video; lists and folders are read as they are consumed.
    ``known``: the corpus's videos, so that a list's URLs already there keep their ids."""
    spec = query.source
    match spec:
        case SearchSource():
            return _search(query.target, spec, cfg)
        case PlaylistSource():
            return _list_playlist(query.target, cfg, spec.max_videos)
        case ListSource():
            return _list_rows(spec, known)
        case UrlsSource():
            return [row_from_url(query.target, "urls", None)]
        case FolderSource():
            return _folder_rows(spec)
    raise TypeError(f"unknown source {spec!r}")


# -- searches and playlists (yt-dlp) --------------------------------------------------------------
def _list_playlist(url: str, cfg: Config, limit: int | None) -> list[dict]:
    opts = base_options(cfg.download) | {"extract_flat": "in_playlist", "noplaylist": False}
    if limit:
        opts["playlistend"] = limit
    info = extract(url, opts, download=False)
    rows = [row_from_entry(e, "playlist", url) for e in info.get("entries") or [] if e]
    return [r for r in rows if r is not None]


def search_request(text: str, spec: SearchSource) -> str:
    """The yt-dlp search URL of one expanded query, e.g. ``ytsearch50:apartment tour 2012``."""
    return f"{spec.prefix}{spec.per_query}:{text}"


def _search(text: str, spec: SearchSource, cfg: Config) -> list[dict]:
    opts = base_options(cfg.download) | {"extract_flat": "in_playlist", "noplaylist": False}
    info = extract(search_request(text, spec), opts, download=False)
    rows = [row_from_entry(e, "search", text) for e in info.get("entries") or [] if e]
    return [r for r in rows if r is not None]


# -- list files (txt, csv, parquet) ---------------------------------------------------------------
LIST_CHUNK = 65536  # records of a list read at a time

# Line breaks, NULs and other control characters: never part of a URL, and a sign of a broken
# list (an unclosed quote swallowing the next lines, binary junk).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def _list_records(spec: ListSource, fmt: str) -> Iterator[list[dict[str, Any]]]:
    """Records of a txt, csv or parquet list file (of format ``fmt``), a chunk at a time (a
    million-line list is never held whole); a malformed file is bad input from the record where
    it breaks."""
    try:
        handle = fsspec.open(spec.path, "rb").open()
    except FileNotFoundError:
        raise BadInputError(f"list file not found: {spec.path}") from None
    with handle:
        if fmt == "parquet":
            try:
                for batch in pq.ParquetFile(handle).iter_batches(batch_size=LIST_CHUNK):
                    yield batch.to_pylist()
            except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
                raise BadInputError(f"unreadable parquet list {spec.path}: {exc}") from None
            return
        text = io.TextIOWrapper(handle, encoding="utf-8-sig", newline="")
        try:
            if fmt == "txt":
                lines = (line.strip() for line in text)
                yield from _chunks({"value": line} for line in lines if line and not line.startswith("#"))
                return
            # Strict: an unclosed quote would otherwise swallow the records after it without a word.
            yield from _chunks(csv.DictReader(text, strict=True))
        except UnicodeDecodeError as exc:
            raise BadInputError(f"list {spec.path} is not UTF-8: {exc}") from None
        except csv.Error as exc:
            raise BadInputError(f"malformed csv list {spec.path}: {exc}") from None


def _chunks(records: Iterable[dict[str, Any]]) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= LIST_CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _list_rows(spec: ListSource, known: Known | None) -> Iterator[dict | BadRecord]:
    fmt = spec.file_format
    number = 0
    for records in _list_records(spec, fmt):
        if number == 0 and records and fmt != "txt":
            wanted = [c for c in (spec.id_column if spec.url_template else spec.url_column,
                                  spec.start_column, spec.end_column, spec.caption_column) if c]
            missing = [c for c in wanted if c not in records[0]]
            if missing:
                raise BadInputError(f"list {spec.path} has no column(s) {', '.join(missing)}; "
                                    f"columns: {', '.join(records[0])}")
        urls = [_record_url(spec, fmt, record) for record in records]
        found = known.find([u for u in urls if u]) if known is not None else {}
        for record, url in zip(records, urls):
            number += 1
            yield _list_row(spec, fmt, record, number, url, found.get(url))


def _text(value: Any) -> str:
    """A list cell as text; empty for None and NaN (a null in a parquet or pandas-made list)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()


def _record_url(spec: ListSource, fmt: str, record: dict[str, Any]) -> str:
    """The URL a record names, as the list has it; empty when it names none."""
    if fmt == "txt":
        value = record["value"]
        return spec.url_template.format(id=value) if spec.url_template else value
    if spec.url_template:
        ident = _text(record[spec.id_column])
        return spec.url_template.format(id=ident) if ident else ""
    return _text(record[spec.url_column])


def _list_row(spec: ListSource, fmt: str, record: dict[str, Any], number: int, url: str,
              known: tuple[str, str] | None) -> dict | BadRecord:
    item, where = f"list:{spec.path}#{number}", f"list {spec.path}: record {number}"
    if not url:
        column = spec.id_column if fmt != "txt" and spec.url_template else spec.url_column
        return BadRecord(item, f"{where} has no {column}")
    if _CONTROL.search(url):
        return BadRecord(item, f"{where}: {url[:100]!r} is not a URL (control characters)")
    start = known_number(record.get(spec.start_column)) if spec.start_column else None
    end = known_number(record.get(spec.end_column)) if spec.end_column else None
    if start is not None and end is not None and end <= start:
        log.warning("list %s: record %d has end <= start; span ignored", spec.path, number)
        start = end = None
    caption = record.get(spec.caption_column) if spec.caption_column else None
    return row_from_url(url, "list", spec.path, known, start_s=start, end_s=end,
                        caption=str(caption) if caption is not None else None)


# -- local folders --------------------------------------------------------------------------------
def _folder_rows(spec: FolderSource) -> list[dict]:
    fs, root = fsspec.core.url_to_fs(spec.path)
    if not fs.isdir(root):
        raise BadInputError(f"folder not found: {spec.path}")
    paths = fs.find(root) if spec.recursive else fs.ls(root, detail=False)
    rows = []
    for path in sorted(paths):
        if posixpath.splitext(path)[1].lower() not in spec.extensions:
            continue
        relative = posixpath.splitext(posixpath.relpath(path, root))[0]
        if not relative.isascii():
            # safe_id turns every non-ASCII character into "_": "厨房" and "客厅" would be one id.
            relative += "-" + hashlib.sha1(relative.encode()).hexdigest()[:8]
        rows.append(video_row(f"file://{path}", "folder", spec.path, "local", safe_id(relative),
                              title=posixpath.basename(path)))
    return rows
