"""Stable identifiers that are safe as file names (DESIGN.md: no title or URL becomes a path)."""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
# A shard member: a safe key and extensions; no separator, no "..", nothing absolute.
_MEMBER = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
# Long ids are shortened with a hash suffix so that they stay unique and fit file-name limits.
_MAX_ID = 120


def safe_id(text: str) -> str:
    """Replace anything outside ``[A-Za-z0-9_-]`` with ``_``; never empty, bounded length."""
    cleaned = _UNSAFE.sub("_", text) or "_"
    if len(cleaned) > _MAX_ID:
        digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:12]
        cleaned = f"{cleaned[: _MAX_ID - 13]}-{digest}"
    return cleaned


def video_id(extractor: str, ident: str) -> str:
    """``<extractor>-<id>``, both parts sanitised."""
    return f"{safe_id(extractor.lower())}-{safe_id(ident)}"


def clip_id(video: str, start_s: float, end_s: float) -> str:
    """``<video_id>-<start_ms>-<end_ms>``."""
    return f"{video}-{round(start_s * 1000)}-{round(end_s * 1000)}"


def batch_name(keys: list[str]) -> str:
    """Name of a committed batch, derived from its keys so a rerun replaces it."""
    digest = hashlib.sha1("\n".join(sorted(keys)).encode("utf-8")).hexdigest()
    return digest[:20]


def feature_key(extractor: str) -> str:
    """A feature extractor's name as used in table paths and shard members (``text:bert`` ->
    ``text_bert``)."""
    return safe_id(extractor)


def check_member(name: str) -> str:
    """``name`` when it is a safe archive member name (``<id>.<ext>...``), else ValueError:
    shards written or read by us never carry a member that could land outside a folder."""
    if not _MEMBER.fullmatch(name):
        raise ValueError(f"unsafe shard member name {name!r}")
    return name
