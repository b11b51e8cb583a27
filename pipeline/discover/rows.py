"""A ``videos`` row of each thing a source lists: a yt-dlp entry, a URL, a local file."""

from __future__ import annotations

import hashlib
import math
import posixpath
from dataclasses import dataclass
from datetime import date
from functools import cache
from typing import Any
from urllib.parse import urlsplit

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
    return video_row(
        url, source, query, extractor, str(ident),
        title=entry.get("title"),
        uploader=entry.get("uploader") or entry.get("channel"),
        upload_date=_date(entry.get("upload_date")),
        duration_s=known_number(entry.get("duration")),
        subtitles_manual=sorted(entry["subtitles"]) if entry.get("subtitles") else None,
        subtitles_auto=(sorted(entry["automatic_captions"])
                        if entry.get("automatic_captions") else None),
    )


def row_from_url(url: str, source: str, query: str | None, **meta: Any) -> dict[str, Any]:
    """A videos row of a video URL, kept and identified in its canonical form."""
    url = canonical_url(url)
    extractor, ident = id_for_url(url)
    return video_row(url, source, query, extractor, ident, **meta)
