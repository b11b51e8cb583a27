"""A ``videos`` row of each thing a source lists: a yt-dlp entry, a URL, a local file."""

from __future__ import annotations

import hashlib
import math
import posixpath
from dataclasses import dataclass
from datetime import UTC, date, datetime
from functools import cache
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
from yt_dlp.extractor import gen_extractor_classes

from pipeline.ids import video_id
from pipeline.discover.urls import canonical_url


@dataclass(frozen=True)
class BadRecord:
    """A record of a list file that names no video to fetch: an errors row, not a videos row."""

    item_id: str
    message: str


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


def _entry_date(entry: dict[str, Any]) -> date | None:
    """The upload date of a listing's entry: its ``upload_date``, else the UTC day of its
    ``timestamp``: YouTube's searches and channel tabs give only a time ago ("3 years ago"),
    which yt-dlp turns into an approximate timestamp with ``youtubetab:approximate_date``."""
    day = _date(entry.get("upload_date"))
    stamp = known_number(entry.get("timestamp"))
    if day is None and stamp is not None:
        day = datetime.fromtimestamp(stamp, UTC).date()
    return day


def known_number(value: Any) -> float | None:
    """``value`` as a finite, non-negative number; None (unknown) for anything else."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number >= 0 else None  # NaN, inf, negatives: unknown


def video_row(url: str, source: str, query: str | None, extractor: str, ident: str,
              **meta: Any) -> dict[str, Any]:
    """A videos row (without discovered_at); metadata not given is unknown (None)."""
    return _row(video_id(extractor, ident), url, source, query, extractor, meta)


def _row(vid: str, url: str, source: str, query: str | None, extractor: str,
         meta: dict[str, Any]) -> dict[str, Any]:
    return {
        "video_id": vid,
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
    return video_row(
        url, source, query, extractor, str(ident),
        title=entry.get("title"),
        uploader=entry.get("uploader") or entry.get("channel"),
        upload_date=_entry_date(entry),
        duration_s=known_number(entry.get("duration")),
        subtitles_manual=sorted(entry["subtitles"]) if entry.get("subtitles") else None,
        subtitles_auto=(sorted(entry["automatic_captions"])
                        if entry.get("automatic_captions") else None),
    )


def row_from_url(url: str, source: str, query: str | None, known: tuple[str, str] | None = None,
                 **meta: Any) -> dict[str, Any]:
    """A videos row of a video URL, kept and identified in its canonical form; ``known``: the
    (video id, extractor) the corpus holds this very URL under (``Known.find``)."""
    if known is not None:
        return _row(known[0], url, source, query, known[1], meta)
    url = canonical_url(url)
    extractor, ident = id_for_url(url)
    return video_row(url, source, query, extractor, ident, **meta)


@dataclass(frozen=True)
class Known:
    """The corpus's videos by the URL each was stored under, its canonical form. A listed URL
    equal to one of them is that video: its canonical form is itself, so its id is the one
    stored, found without trying yt-dlp's extractors on it (about 24 µs a YouTube URL, 8 ms
    a page that none of them claims): a list of a million known videos read again each night."""

    urls: pa.ChunkedArray
    ids: pa.ChunkedArray
    extractors: pa.ChunkedArray

    @classmethod
    def of(cls, table: pa.Table) -> Known:
        """From the ``url``, ``video_id`` and ``extractor`` columns of the videos table."""
        return cls(*(table.column(name) for name in ("url", "video_id", "extractor")))

    def find(self, urls: list[str]) -> dict[str, tuple[str, str]]:
        """Of ``urls``, those the corpus holds: (video id, extractor) by URL. The hash table is
        the few listed URLs', the corpus's probe it (a chunk of a list at a time)."""
        if not urls or not len(self.urls):
            return {}
        hit = pc.is_in(self.urls, value_set=pa.array(urls, pa.string()))
        return dict(zip(pc.filter(self.urls, hit).to_pylist(),
                        zip(pc.filter(self.ids, hit).to_pylist(), pc.filter(self.extractors, hit).to_pylist())))
