"""The discover stage: config sources in, one ``videos`` row per candidate video out.

Searches and playlists are listed with yt-dlp's flat extraction (no media requests); URL and id
lists and local folders are read without touching the network. Videos are deduplicated by
video_id across sources (the first source in config order wins), filtered on what metadata is
known, and appended: a scheduled rerun adds new videos and keeps the ones already found.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
import posixpath
import re
from collections import Counter
import os
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from yt_dlp.extractor import gen_extractor_classes

from pipeline.config import (
    Config,
    FiltersConfig,
    FolderSource,
    ListSource,
    PlaylistSource,
    SearchSource,
    Source,
    UrlsSource,
)
from pipeline import partitions
from pipeline.errors import BadInputError, ErrorKind, classify
from pipeline.ids import batch_name, safe_id, video_id
from pipeline.partitions import CORPUS, index_of as partition_index
from pipeline.progress import log, track
from pipeline.runner import RetryPolicy, StageContext, error_row, retrying
from pipeline.storage import Corpus
from pipeline.urls import canonical_url
from pipeline.ytdlp import base_options, extract
from schemas.tables import VIDEOS


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


# -- turning listings into rows -----------------------------------------------------------------
@cache
def _extractors() -> tuple:
    # The generic extractor matches everything, so it is tried last.
    classes = [ie for ie in gen_extractor_classes() if ie.ie_key() != "Generic"]
    return tuple(classes)


def id_for_url(url: str) -> tuple[str, str]:
    """(extractor, id) of a URL without a request; generic pages get a stable URL-based id."""
    for ie in _extractors():
        if ie.suitable(url):
            temp = ie.get_temp_id(url)
            if temp:
                return ie.ie_key(), temp
            break
    parts = urlsplit(url)
    stem = posixpath.splitext(posixpath.basename(parts.path.rstrip("/")))[0] or parts.hostname
    # Same page name on two sites must not collide.
    digest = hashlib.sha1(url.encode()).hexdigest()[:8]
    return "generic", f"{stem or 'page'}-{digest}"


def _date(value: Any) -> date | None:
    text = str(value or "")
    if len(text) == 8 and text.isdigit():
        return date(int(text[:4]), int(text[4:6]), int(text[6:]))
    return None


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None  # NaN, inf, negatives: unknown


def _row(url: str, source: str, query: str | None, extractor: str, ident: str,
         **meta: Any) -> dict[str, Any]:
    return {
        "video_id": video_id(extractor, ident),
        "url": url,
        "extractor": extractor.lower(),
        "source": source,
        "query": query,
        "title": meta.get("title"),
        "uploader": meta.get("uploader"),
        "upload_date": meta.get("upload_date"),
        "duration_s": meta.get("duration_s"),
        "subtitles_manual": meta.get("subtitles_manual"),
        "subtitles_auto": meta.get("subtitles_auto"),
        "start_s": meta.get("start_s"),
        "end_s": meta.get("end_s"),
        "caption": meta.get("caption"),
    }


def row_from_entry(entry: dict[str, Any], source: str, query: str) -> dict[str, Any] | None:
    """A videos row from a yt-dlp (flat) playlist entry; None for entries that are not videos."""
    ident = entry.get("id")
    url = entry.get("webpage_url") or entry.get("url")
    if not ident or not url or entry.get("_type") == "playlist":
        return None
    url = canonical_url(url)
    extractor = entry.get("ie_key") or entry.get("extractor_key") or "generic"
    return _row(
        url, source, query, extractor, str(ident),
        title=entry.get("title"),
        uploader=entry.get("uploader") or entry.get("channel"),
        upload_date=_date(entry.get("upload_date")),
        duration_s=_number(entry.get("duration")),
        subtitles_manual=sorted(entry["subtitles"]) if entry.get("subtitles") else None,
        subtitles_auto=(sorted(entry["automatic_captions"])
                        if entry.get("automatic_captions") else None),
    )


@dataclass(frozen=True)
class BadRecord:
    """A record of a list file that names no video to fetch: an errors row, not a videos row."""

    item_id: str
    message: str


def _text(value: Any) -> str:
    """A list cell as text; empty for None and NaN (a null in a parquet or pandas-made list)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return str(value).strip()


# Line breaks, NULs and other control characters: never part of a URL, and a sign of a broken
# list (an unclosed quote swallowing the next lines, binary junk).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def row_from_url(url: str, source: str, query: str | None, **meta: Any) -> dict[str, Any]:
    """A videos row of a video URL, kept and identified in its canonical form."""
    url = canonical_url(url)
    extractor, ident = id_for_url(url)
    return _row(url, source, query, extractor, ident, **meta)


# -- listing each kind of source ----------------------------------------------------------------
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


LIST_CHUNK = 65536  # records of a list read at a time


def _list_records(spec: ListSource) -> Iterator[list[dict[str, Any]]]:
    """Records of a txt, csv or parquet list file, a chunk at a time (a million-line list is
    never held whole); a malformed file is bad input from the record where it breaks."""
    try:
        handle = fsspec.open(spec.path, "rb").open()
    except FileNotFoundError:
        raise BadInputError(f"list file not found: {spec.path}") from None
    with handle:
        fmt = spec.file_format
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


def _list_rows(spec: ListSource) -> Iterator[dict | BadRecord]:
    number = 0
    for records in _list_records(spec):
        if number == 0 and records and spec.file_format != "txt":
            wanted = [c for c in (spec.id_column if spec.url_template else spec.url_column,
                                  spec.start_column, spec.end_column, spec.caption_column) if c]
            missing = [c for c in wanted if c not in records[0]]
            if missing:
                raise BadInputError(f"list {spec.path} has no column(s) {', '.join(missing)}; "
                                    f"columns: {', '.join(records[0])}")
        for record in records:
            number += 1
            yield _list_row(spec, record, number)


def _list_row(spec: ListSource, record: dict[str, Any], number: int) -> dict | BadRecord:
    item, where = f"list:{spec.path}#{number}", f"list {spec.path}: record {number}"
    if spec.file_format == "txt":
        value = record["value"]
        url = spec.url_template.format(id=value) if spec.url_template else value
    elif spec.url_template:
        ident = _text(record[spec.id_column])
        if not ident:
            return BadRecord(item, f"{where} has no {spec.id_column}")
        url = spec.url_template.format(id=ident)
    else:
        url = _text(record[spec.url_column])
    if not url:
        return BadRecord(item, f"{where} has no {spec.url_column}")
    if _CONTROL.search(url):
        return BadRecord(item, f"{where}: {url[:100]!r} is not a URL (control characters)")
    start = _number(record.get(spec.start_column)) if spec.start_column else None
    end = _number(record.get(spec.end_column)) if spec.end_column else None
    if start is not None and end is not None and end <= start:
        log.warning("list %s: record %d has end <= start; span ignored", spec.path, number)
        start = end = None
    caption = record.get(spec.caption_column) if spec.caption_column else None
    return row_from_url(url, "list", spec.path, start_s=start, end_s=end,
                        caption=str(caption) if caption is not None else None)


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
        rows.append(_row(f"file://{path}", "folder", spec.path, "local", safe_id(relative),
                         title=posixpath.basename(path)))
    return rows


def list_query(query: Query, cfg: Config) -> Iterable[dict[str, Any] | BadRecord]:
    """The videos rows one query yields (before dedup, scheme checks and filters), and the
    records of a list that name no video; lists and folders are read as they are consumed."""
    spec = query.source
    match spec:
        case SearchSource():
            return _search(query.target, spec, cfg)
        case PlaylistSource():
            return _list_playlist(query.target, cfg, spec.max_videos)
        case ListSource():
            return _list_rows(spec)
        case UrlsSource():
            return [row_from_url(query.target, "urls", None)]
        case FolderSource():
            return _folder_rows(spec)
    raise TypeError(f"unknown source {spec!r}")


# -- checks ---------------------------------------------------------------------------------------
def scheme_problem(url: str, allowed: list[str], source: str) -> str | None:
    """Why a URL may not be fetched, or None. Folder sources are local by their own config."""
    scheme = urlsplit(url).scheme.lower()
    if source == "folder" and scheme == "file":
        return None
    if scheme not in allowed:
        return (f"URL scheme {scheme or '(none)'!r} is not allowed (download.allowed_schemes: "
                f"{', '.join(allowed)})")
    return None


def drop_reason(row: dict[str, Any], filters: FiltersConfig) -> str | None:
    """Why a video is filtered out, judged only on metadata that is known."""
    duration = row["duration_s"]
    if duration is not None:
        if filters.min_duration_s is not None and duration < filters.min_duration_s:
            return "too_short"
        if filters.max_duration_s is not None and duration > filters.max_duration_s:
            return "too_long"
    uploaded = row["upload_date"]
    if uploaded is not None:
        if filters.upload_date_after and uploaded < filters.upload_date_after:
            return "uploaded_before_range"
        if filters.upload_date_before and uploaded > filters.upload_date_before:
            return "uploaded_after_range"
    manual, auto = row["subtitles_manual"], row["subtitles_auto"]
    known = manual is not None or auto is not None
    if known and filters.require_subtitles != "none":
        langs = set(manual or []) | (set(auto or []) if filters.require_subtitles == "any" else set())
        if not langs:
            return "no_subtitles"
    if known and filters.subtitle_langs:
        if not set(filters.subtitle_langs) & (set(manual or []) | set(auto or [])):
            return "no_subtitles_in_langs"
    return None


# -- the stage ------------------------------------------------------------------------------------
@dataclass
class DiscoverReport:
    queries: int = 0
    failed_queries: int = 0
    found: int = 0
    duplicates: int = 0
    refused: int = 0
    dropped: dict[str, int] | None = None
    known_before: int = 0
    added: int = 0
    partitions: int = 0
    per_query: dict[str, int] | None = None


# Rows found, in the order found, spilled to local scratch space before dedup: a list of a
# million videos is never held as Python objects.
_SPILL_ROWS = 50_000
_ORDER, _PARTITION = "_order", "_partition"
ERROR_CHUNK = 10_000


class _Spill:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.rows: list[dict[str, Any]] = []
        self.files: list[str] = []
        self.count = 0

    def add(self, row: dict[str, Any]) -> None:
        self.rows.append(row | {_ORDER: self.count})
        self.count += 1
        if len(self.rows) >= _SPILL_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            path = os.path.join(self.directory, f"{len(self.files):06d}.parquet")
            pq.write_table(pa.Table.from_pylist(self.rows, schema=_SPILL_SCHEMA), path)
            self.files.append(path)
            self.rows = []

    def distinct_videos(self) -> int:
        if not self.files:
            return 0
        ids = ds.dataset(self.files).to_table(columns=["video_id"]).column("video_id")
        return pc.count_distinct(ids).as_py()

    def by_partition(self, partitions: int) -> ds.Dataset:
        """The spilled rows with their partition, each file sorted by it (so that reading one
        partition skips the rest of every file)."""
        for path in self.files:
            table = pq.read_table(path)
            index = [partition_index(v, partitions) for v in table.column("video_id").to_pylist()]
            table = table.append_column(_PARTITION, pa.array(index, pa.int32()))
            pq.write_table(table.sort_by([(_PARTITION, "ascending"), (_ORDER, "ascending")]),
                           path, row_group_size=2048)
        return ds.dataset(self.files)


_SPILL_SCHEMA = VIDEOS.remove_metadata().remove(VIDEOS.get_field_index("discovered_at")).append(
    pa.field(_ORDER, pa.int64()))


class _Errors:
    """Error rows of discover, committed in chunks to the ``corpus`` partition under names
    derived from their items, so a rerun that finds the same problems replaces them."""

    def __init__(self, corpus: Corpus, now: datetime) -> None:
        self.corpus, self.now = corpus, now
        self.rows: list[dict[str, Any]] = []

    def add(self, item: str, kind: ErrorKind, message: str, attempt: int = 1) -> None:
        self.rows.append(error_row("discover", item, kind, message, attempt, self.now))
        if len(self.rows) >= ERROR_CHUNK:
            self.flush()

    def flush(self) -> None:
        if self.rows:
            name = f"discover-{batch_name([r['item_id'] for r in self.rows])}"
            self.corpus.write_batch("errors", self.rows, name, CORPUS)
            self.rows = []


def _rows(query: Query, cfg: Config, retry: RetryPolicy) -> tuple[Iterable | None, Exception | None, int]:
    """A query's rows: searches and playlists listed now, with retries; lists and folders as
    they are read."""
    if query.kind in ("search", "playlist"):
        result, exc, tries = retrying(lambda: list(list_query(query, cfg)), retry)
        return result, exc, tries
    return list_query(query, cfg), None, 1


def discover(ctx: StageContext) -> DiscoverReport:
    """Run every query, dedup, filter, and append the new videos, partition by partition, in
    atomic batches. Fixes the corpus's partition count at its first build."""
    cfg: Config = ctx.config
    corpus = ctx.corpus
    todo = queries(cfg)
    log.info("discover: %d queries: %s", len(todo), "; ".join(q.key for q in todo[:50])
             + (" ..." if len(todo) > 50 else ""))
    report = DiscoverReport(queries=len(todo), dropped={}, per_query={})
    now = datetime.now(UTC)
    errors = _Errors(corpus, now)
    with tempfile.TemporaryDirectory(prefix="vlcorpus-discover-") as scratch:
        spill = _Spill(scratch)
        with ThreadPoolExecutor(max_workers=cfg.download.concurrency) as pool:
            listed = pool.map(lambda q: (q, *_rows(q, cfg, ctx.retry)), todo)
            for query, rows, exc, tries in track(listed, "discover", total=len(todo)):
                report.per_query[query.key] = 0
                try:
                    if exc is not None:
                        raise exc
                    for row in rows:
                        _check(row, query, cfg, report, errors, spill)
                except Exception as failure:  # noqa: BLE001 - the query's errors row
                    kind, message = classify(failure)
                    report.failed_queries += 1
                    errors.add(query.key, kind, message, tries)
        spill.flush()
        _commit(corpus, cfg, spill, report, errors, now)
    errors.flush()
    log.info("discover: %d found, %d duplicates, %d refused, %d dropped %s, %d new in %d partitions",
             report.found, report.duplicates, report.refused, sum(report.dropped.values()),
             report.dropped, report.added, report.partitions)
    return report


def _check(row: dict | BadRecord, query: Query, cfg: Config, report: DiscoverReport,
           errors: _Errors, spill: _Spill) -> None:
    if isinstance(row, BadRecord):
        report.refused += 1
        errors.add(row.item_id, ErrorKind.BAD_INPUT, row.message)
        return
    report.per_query[query.key] += 1
    report.found += 1
    problem = scheme_problem(row["url"], cfg.download.allowed_schemes, row["source"])
    if problem:
        report.refused += 1
        errors.add(row["url"], ErrorKind.BAD_INPUT, problem)
        return
    spill.add(row)


def _commit(corpus: Corpus, cfg: Config, spill: _Spill, report: DiscoverReport,
            errors: _Errors, now: datetime) -> None:
    """Dedup (the first found wins), filter and write the new videos, partition by partition."""
    found = spill.distinct_videos()
    requested = cfg.execution.partitions or corpus.recorded_partitions()
    if requested is None and not found:
        report.dropped = {}
        return  # nothing yet to size the partitions by
    count = corpus.init_partitions(requested or partitions.choose(found))
    report.partitions = count
    spilled = spill.by_partition(count)
    drops: Counter = Counter()
    for index in range(count):
        rows = spilled.to_table(filter=ds.field(_PARTITION) == index).sort_by(_ORDER)
        if not rows.num_rows:
            continue
        label = partitions.label(index)
        known = set(corpus.done_keys("videos", label).to_pylist())
        new: dict[str, dict[str, Any]] = {}
        first: dict[str, dict[str, Any]] = {}
        for row in rows.drop_columns([_ORDER, _PARTITION]).to_pylist():
            vid = row["video_id"]
            if vid in first:
                if row["source"] == "folder" and first[vid]["url"] != row["url"]:
                    # Two files, not one video found twice: neither may vanish silently.
                    report.refused += 1
                    errors.add(row["url"], ErrorKind.BAD_INPUT,
                               f"{row['url']} gets the same video id {vid!r} as "
                               f"{first[vid]['url']}; rename one of them")
                    continue
                report.duplicates += 1
                continue
            reason = drop_reason(row, cfg.filters)
            if reason:
                drops[reason] += 1
                continue
            first[vid] = row
            if vid in known:
                report.known_before += 1
            else:
                new[vid] = row | {"discovered_at": now}
        if new:
            keys = sorted(new)
            corpus.write_batch("videos", [new[k] for k in keys], f"discover-{batch_name(keys)}",
                               label, done=keys)
            corpus.compact("videos", label)
            report.added += len(keys)
    report.dropped = dict(drops)
