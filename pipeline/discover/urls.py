"""One video, one URL: the parts of a video URL that do not change the video are dropped before
its id is made, so that ``page.html`` and ``page.html#again`` (or a YouTube link shared with
``&t=42s&si=...``) are one video, not two with the same clips on both sides of a split."""

from __future__ import annotations

from urllib.parse import unquote_plus, urlsplit, urlunsplit

_YOUTUBE_HOSTS = ("youtube.com", "youtu.be", "youtube-nocookie.com")
# Where to start, which playlist it was found in, and share/referral tracking.
_YOUTUBE_PARAMS = {"t", "feature", "si"}
_YOUTUBE_PLAYLIST_PARAMS = {"list", "index"}  # dropped only when the URL names a video


def _is_youtube(host: str) -> bool:
    return any(host == h or host.endswith("." + h) for h in _YOUTUBE_HOSTS)


def canonical_url(url: str) -> str:
    """``url`` without its fragment, its ``utm_*`` parameters and, on YouTube, the parameters
    ``t``, ``feature``, ``si`` (and ``list``, ``index`` of a video's URL). The rest is kept
    byte for byte."""
    parts = urlsplit(url)
    pairs = [p for p in parts.query.split("&") if p]
    names = [unquote_plus(p.split("=", 1)[0]) for p in pairs]
    host = (parts.hostname or "").lower()
    drop = set()
    if _is_youtube(host):
        drop |= _YOUTUBE_PARAMS
        if "v" in names or host.endswith("youtu.be") or "/shorts/" in parts.path:
            drop |= _YOUTUBE_PLAYLIST_PARAMS
    kept = [p for p, name in zip(pairs, names)
            if name not in drop and not name.lower().startswith("utm_")]
    if len(kept) == len(pairs) and "#" not in url:
        return url
    return urlunsplit((parts.scheme, parts.netloc, parts.path, "&".join(kept), ""))
