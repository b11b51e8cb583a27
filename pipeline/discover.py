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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import fsspec
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
from pipeline.errors import BadInputError, ErrorKind, classify
from pipeline.ids import batch_name, safe_id, video_id
from pipeline.progress import log, track
from pipeline.runner import StageContext, retrying
from pipeline.urls import canonical_url
from pipeline.ytdlp import base_options, extract


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


def _read_list(spec: ListSource) -> list[dict[str, Any]]:
    """Records of a txt, csv or parquet list file; malformed files are bad input."""
    try:
        with fsspec.open(spec.path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise BadInputError(f"list file not found: {spec.path}") from None
    fmt = spec.file_format
    if fmt == "parquet":
        try:
            return pq.read_table(io.BytesIO(raw)).to_pylist()
        except Exception as exc:  # noqa: BLE001 - any parse failure is the file's fault
            raise BadInputError(f"unreadable parquet list {spec.path}: {exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise BadInputError(f"list {spec.path} is not UTF-8: {exc}") from None
    if fmt == "txt":
        lines = (line.strip() for line in text.splitlines())
        return [{"value": line} for line in lines if line and not line.startswith("#")]
    # Strict: an unclosed quote would otherwise swallow the records after it without a word.
    reader = csv.DictReader(io.StringIO(text), strict=True)
    try:
        records = list(reader)
    except csv.Error as exc:
        raise BadInputError(f"malformed csv list {spec.path}: {exc}") from None
    return records


def _list_rows(spec: ListSource) -> list[dict | BadRecord]:
    records = _read_list(spec)
    if records and spec.file_format != "txt":
        wanted = [c for c in (spec.id_column if spec.url_template else spec.url_column,
                              spec.start_column, spec.end_column, spec.caption_column) if c]
        missing = [c for c in wanted if c not in records[0]]
        if missing:
            raise BadInputError(f"list {spec.path} has no column(s) {', '.join(missing)}; "
                                f"columns: {', '.join(records[0])}")
    rows: list[dict | BadRecord] = []
    for number, record in enumerate(records, start=1):
        item, where = f"list:{spec.path}#{number}", f"list {spec.path}: record {number}"
        if spec.file_format == "txt":
            value = record["value"]
            url = spec.url_template.format(id=value) if spec.url_template else value
        elif spec.url_template:
            ident = _text(record[spec.id_column])
            if not ident:
                rows.append(BadRecord(item, f"{where} has no {spec.id_column}"))
                continue
            url = spec.url_template.format(id=ident)
        else:
            url = _text(record[spec.url_column])
        if not url:
            rows.append(BadRecord(item, f"{where} has no {spec.url_column}"))
            continue
        if _CONTROL.search(url):
            rows.append(BadRecord(item, f"{where}: {url[:100]!r} is not a URL (control characters)"))
            continue
        start = _number(record.get(spec.start_column)) if spec.start_column else None
        end = _number(record.get(spec.end_column)) if spec.end_column else None
        if start is not None and end is not None and end <= start:
            log.warning("list %s: record %d has end <= start; span ignored", spec.path, number)
            start = end = None
        caption = record.get(spec.caption_column) if spec.caption_column else None
        rows.append(row_from_url(url, "list", spec.path, start_s=start, end_s=end,
                                 caption=str(caption) if caption is not None else None))
    return rows


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


def list_query(query: Query, cfg: Config) -> list[dict[str, Any] | BadRecord]:
    """The videos rows one query yields (before dedup, scheme checks and filters), and the
    records of a list that name no video."""
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
    per_query: dict[str, int] | None = None


def discover(ctx: StageContext) -> DiscoverReport:
    """Run every query, dedup, filter, and append the new videos in atomic batches."""
    cfg: Config = ctx.config
    corpus = ctx.corpus
    corpus.sweep_temporary("videos")
    todo = queries(cfg)
    log.info("discover: %d queries: %s", len(todo), "; ".join(q.key for q in todo[:50])
             + (" ..." if len(todo) > 50 else ""))
    report = DiscoverReport(queries=len(todo), dropped={}, per_query={})
    now = datetime.now(UTC)
    error_rows: list[dict[str, Any]] = []

    def run(query: Query) -> tuple[Query, list[dict] | None, Exception | None, int]:
        result, exc, tries = retrying(lambda: list_query(query, cfg), ctx.retry)
        return query, result, exc, tries

    found: dict[str, dict[str, Any]] = {}
    drops: Counter = Counter()
    with ThreadPoolExecutor(max_workers=cfg.download.concurrency) as pool:
        results = track(pool.map(run, todo), "discover", total=len(todo))
        for query, rows, exc, tries in results:
            if exc is not None:
                kind, message = classify(exc)
                report.failed_queries += 1
                error_rows.append(_error(query.key, kind, message, tries, now))
                continue
            report.per_query[query.key] = sum(1 for row in rows if isinstance(row, dict))
            for row in rows:
                if isinstance(row, BadRecord):
                    report.refused += 1
                    error_rows.append(_error(row.item_id, ErrorKind.BAD_INPUT, row.message, 1, now))
                    continue
                report.found += 1
                problem = scheme_problem(row["url"], cfg.download.allowed_schemes, row["source"])
                if problem:
                    report.refused += 1
                    error_rows.append(_error(row["url"], ErrorKind.BAD_INPUT, problem, 1, now))
                    continue
                if row["video_id"] in found:
                    first = found[row["video_id"]]
                    if row["source"] == "folder" and first["url"] != row["url"]:
                        # Two files, not one video found twice: neither may vanish silently.
                        report.refused += 1
                        error_rows.append(_error(
                            row["url"], ErrorKind.BAD_INPUT,
                            f"{row['url']} gets the same video id {row['video_id']!r} as "
                            f"{first['url']}; rename one of them", 1, now))
                        continue
                    report.duplicates += 1
                    continue
                reason = drop_reason(row, cfg.filters)
                if reason:
                    drops[reason] += 1
                    continue
                found[row["video_id"]] = row | {"discovered_at": now}
    report.dropped = dict(drops)
    known = set(corpus.done("videos"))
    report.known_before = len(known & set(found))
    new = sorted(set(found) - known)
    size = cfg.execution.batch_size * 64  # videos rows are small: fewer, larger files
    for i in range(0, len(new), size):
        keys = new[i : i + size]
        corpus.write_batch("videos", [found[k] for k in keys], f"discover-{batch_name(keys)}",
                           done={k: 1 for k in keys})
    report.added = len(new)
    if error_rows:
        corpus.write_batch("errors", error_rows,
                           f"discover-{batch_name([r['item_id'] for r in error_rows])}")
    log.info("discover: %d found, %d duplicates, %d refused, %d dropped %s, %d new",
             report.found, report.duplicates, report.refused, sum(drops.values()),
             dict(drops), report.added)
    return report


def _error(item: str, kind: ErrorKind, message: str, attempt: int, now: datetime) -> dict:
    return {"stage": "discover", "item_id": item, "kind": kind.value, "message": message,
            "attempt": attempt, "time": now}
