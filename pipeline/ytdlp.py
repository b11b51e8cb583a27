"""What discover and download share about yt-dlp: options, logging, error classification."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import yt_dlp
from yt_dlp.networking.exceptions import RequestError
from yt_dlp.utils import parse_bytes

from pipeline.config import DownloadConfig
from pipeline.errors import BadInputError, ErrorKind, PermanentError, StageError, TransientError
from pipeline.progress import log

# yt-dlp messages, most specific first. Unknown messages are permanent: retrying them on every
# run would hammer a site for nothing; `--retry-failed` retries them on request.
_KINDS: list[tuple[re.Pattern[str], ErrorKind]] = [
    (re.compile(p, re.I), kind)
    for p, kind in [
        (r"HTTP Error 429|Too Many Requests|rate.?limit", ErrorKind.TRANSIENT),
        (r"HTTP Error 5\d\d", ErrorKind.TRANSIENT),
        (r"timed? ?out|Connection (reset|refused|aborted)|Remote end closed|IncompleteRead"
         r"|RemoteDisconnected|Temporary failure|EOF occurred|Broken pipe|BadStatusLine"
         r"|Errno 10[45]|Errno 111|Errno 32", ErrorKind.TRANSIENT),
        (r"HTTP Error (404|410|403|401)|Private video|Video unavailable|has been removed"
         r"|no longer available|account .* terminated|not (made )?available in your country"
         r"|geo.?restrict|members.only|Sign in to confirm|copyright claim", ErrorKind.PERMANENT),
        (r"Unsupported URL|No video formats found|Requested format is not available"
         r"|is not a valid URL|no suitable InfoExtractor|Unable to extract"
         r"|File is larger than max-filesize|does not pass filter", ErrorKind.BAD_INPUT),
        # A page or redirect that points at a local file (or another scheme yt-dlp refuses).
        (r"file:// URLs are disabled|No connection adapters were found|Unsupported url scheme",
         ErrorKind.BAD_INPUT),
    ]
]


_ERRORS: dict[ErrorKind, type[StageError]] = {
    ErrorKind.TRANSIENT: TransientError,
    ErrorKind.PERMANENT: PermanentError,
    ErrorKind.BAD_INPUT: BadInputError,
}


def classify_message(message: str) -> ErrorKind:
    for pattern, kind in _KINDS:
        if pattern.search(message):
            return kind
    return ErrorKind.PERMANENT


def clean_message(message: str) -> str:
    """yt-dlp's message without its terminal colour codes and "ERROR:" prefix."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", message).strip()
    return re.sub(r"^ERROR:\s*", "", text)


# yt-dlp says why it skipped a download only on screen ("File is larger than max-filesize
# (... bytes > ... bytes). Aborting."), not with an exception: such lines are kept for the error.
_NOTABLE = re.compile(r"larger than max-filesize|smaller than min-filesize|does not pass filter", re.I)


class _Logger:
    """Routes yt-dlp's output to our logger at debug level; its errors surface as exceptions.
    ``notes`` keeps the last few screen lines that explain a skipped download."""

    def __init__(self) -> None:
        self.notes: deque[str] = deque(maxlen=4)

    def debug(self, msg: str) -> None:
        log.debug("yt-dlp: %s", msg)
        if _NOTABLE.search(msg):
            note = re.sub(r"^\[\w+\]\s*", "", clean_message(msg)).removesuffix(" Aborting.")
            self.notes.append(note)

    def info(self, msg: str) -> None:
        log.debug("yt-dlp: %s", msg)

    def warning(self, msg: str) -> None:
        log.debug("yt-dlp warning: %s", clean_message(msg))

    def error(self, msg: str) -> None:
        log.debug("yt-dlp error: %s", clean_message(msg))


def base_options(cfg: DownloadConfig) -> dict[str, Any]:
    """Options every yt-dlp call gets; secrets go in here and are never logged."""
    opts: dict[str, Any] = {
        "quiet": True,
        "no_warnings": True,
        "noprogress": True,
        "logger": _Logger(),
        "socket_timeout": min(cfg.timeout_s, 60.0),
        # The runner retries with backoff and records failures; yt-dlp's own retries stay
        # for the media transfer itself, where resuming a partial file is cheap.
        "extractor_retries": 0,
        "retries": cfg.retries,
        "fragment_retries": cfg.retries,
        "noplaylist": True,
    }
    if cfg.proxy is not None:
        opts["proxy"] = cfg.proxy.get_secret_value()
    if cfg.cookies_file:
        opts["cookiefile"] = cfg.cookies_file
    if cfg.user_agent:
        opts["http_headers"] = {"User-Agent": cfg.user_agent}
    if cfg.rate_limit:
        opts["ratelimit"] = parse_bytes(cfg.rate_limit)
    if cfg.sleep_interval_s:
        opts["sleep_interval"] = cfg.sleep_interval_s
        opts["max_sleep_interval"] = cfg.max_sleep_interval_s or cfg.sleep_interval_s
    if cfg.max_filesize_mb:
        opts["max_filesize"] = int(cfg.max_filesize_mb * 1024 * 1024)
    return opts


def extract(url: str, opts: dict[str, Any], download: bool) -> dict[str, Any]:
    """``YoutubeDL.extract_info`` with yt-dlp errors turned into our error kinds."""
    try:
        with yt_dlp.YoutubeDL(opts) as ydl:
            info = ydl.extract_info(url, download=download)
            return ydl.sanitize_info(info)
    except (yt_dlp.utils.DownloadError, RequestError) as exc:
        # Most failures come wrapped in DownloadError; a few network errors (e.g. a redirect to
        # a file:// URL) come out of yt-dlp bare.
        message = clean_message(str(exc))
        raise _ERRORS[classify_message(message)](message) from None
