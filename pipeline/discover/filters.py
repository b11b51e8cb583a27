"""Which discovered videos are kept: URL schemes that may be fetched (download checks them
again), and the config's filters on known metadata."""

from __future__ import annotations

from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

from pipeline.config import FiltersConfig


def scheme_problem(url: str, allowed: list[str], source: str) -> str | None:
    """Why a URL may not be fetched, or None. Folder sources are local by their own config."""
    head, colon, _ = url.partition(":")
    scheme = _scheme(head) if colon else ""
    if source == "folder" and scheme == "file":
        return None
    if scheme not in allowed:
        return (f"URL scheme {scheme or '(none)'!r} is not allowed (download.allowed_schemes: "
                f"{', '.join(allowed)})")
    return None


@lru_cache(maxsize=64)
def _scheme(head: str) -> str:
    """The scheme of a URL whose first colon follows ``head``: urlsplit reads it from what
    precedes that colon alone, so a list of a million URLs parses a few heads (10 µs a URL)."""
    return urlsplit(f"{head}:").scheme.lower()


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
