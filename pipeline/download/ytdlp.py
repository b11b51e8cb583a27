"""What discover and download share about yt-dlp: options, egress, logging, error classification."""

from __future__ import annotations

import copy
import hashlib
import os
import re
import shutil
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import yt_dlp
from pydantic import SecretStr
from yt_dlp.networking.exceptions import RequestError
from yt_dlp.utils import parse_bytes

from pipeline.config import DownloadConfig
from pipeline.errors import (
    NETWORK_FAILURE,
    ErrorKind,
    NetworkError,
    PermanentError,
    StageError,
    error,
    network_failure,
)
from pipeline.progress import log
from pipeline.download.ytdlp_args import browser_cookies, extractor_args, preset_options

# yt-dlp messages, most specific first. The YouTube ones are those of
# yt_dlp/extractor/youtube/_video.py (`_real_extract`, `_extract_player_responses`), which pass
# YouTube's own reasons through and append a cookies hint to every reason that says "sign in":
# the bot check ("Sign in to confirm you’re not a bot", with a curly apostrophe), age gates and
# private videos alike. So a block is told by "not a bot", never by the hint.
_KINDS: list[tuple[re.Pattern[str], ErrorKind]] = [
    (re.compile(p, re.I), kind)
    for p, kind in [
        # The session, not the video: a block (before "Video unavailable", which YouTube puts
        # in front of its rate-limit message).
        (r"\bnot a bot\b|try again later|has been rate-limited|HTTP Error 429|Too Many Requests"
         r"|Your IP is likely being blocked|requiring a captcha", ErrorKind.BLOCKED),
        (r"HTTP Error 5\d\d", ErrorKind.TRANSIENT),
        # The network or the machine, not the video (a DNS outage is no verdict on it).
        (NETWORK_FAILURE, ErrorKind.TRANSIENT),
        (r"HTTP Error (404|410|401)|Private video|Video unavailable|has been removed"
         r"|no longer available|account .* terminated|not (made )?available in your country"
         r"|not available from your location|geo.?restrict|members.only|members on level"
         r"|confirm your age|age.restricted|inappropriate for some users|copyright",
         ErrorKind.PERMANENT),
        (r"Unsupported URL|No video formats found|Requested format is not available"
         r"|is not a valid URL|no suitable InfoExtractor|Unable to extract"
         r"|File is larger than max-filesize|does not pass filter", ErrorKind.BAD_INPUT),
        # A page or redirect that points at a local file (or another scheme yt-dlp refuses).
        (r"file:// URLs are disabled|No connection adapters were found|Unsupported url scheme",
         ErrorKind.BAD_INPUT),
    ]
]
_FORBIDDEN = re.compile(r"HTTP Error 403", re.I)


class ForbiddenError(PermanentError):
    """HTTP 403: an expired signed URL, the video's own refusal, or, when it repeats across
    videos, a block. Permanent for discover; download decides with pipeline/download/breaker.py."""


def classify_message(message: str) -> ErrorKind:
    """The kind of a yt-dlp error message; an HTTP 403 alone is permanent (see ForbiddenError).
    Unknown messages are permanent too: retrying them on every run would hammer a site for
    nothing; `--retry-failed` retries them on request."""
    for pattern, kind in _KINDS:
        if pattern.search(message):
            return kind
    return ErrorKind.PERMANENT


def clean_message(message: str) -> str:
    """yt-dlp's message without its terminal colour codes and "ERROR:" prefix."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", message).strip()
    return re.sub(r"^ERROR:\s*", "", text)


def _classified(exc: Exception) -> StageError:
    message = clean_message(str(exc))
    kind = classify_message(message)
    if kind == ErrorKind.PERMANENT and _FORBIDDEN.search(message):
        return ForbiddenError(message)
    if kind == ErrorKind.TRANSIENT and network_failure(message):
        return NetworkError(message)
    return error(kind, message)


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


@dataclass(frozen=True)
class Egress:
    """A way out to the sites: the direct connection or one proxy. ``key`` names it in the
    breaker's shared state without its credentials."""

    key: str
    proxy: SecretStr | None = None


def egresses(cfg: DownloadConfig) -> list[Egress]:
    """The configured egresses in order: the proxies, the one proxy, or the direct connection."""
    proxies = cfg.proxies or ([cfg.proxy] if cfg.proxy is not None else [])
    if not proxies:
        return [Egress("direct")]
    out = []
    for proxy in proxies:
        parts = urlsplit(proxy.get_secret_value())
        where = f"{parts.scheme}://{parts.hostname}:{parts.port}"  # no user or password
        out.append(Egress(f"proxy-{hashlib.sha1(where.encode()).hexdigest()[:10]}", proxy))
    return out


# Our sleep_* keys over yt-dlp's option names.
_SLEEPS = {"sleep_requests_s": "sleep_interval_requests", "sleep_interval_s": "sleep_interval",
           "max_sleep_interval_s": "max_sleep_interval", "sleep_subtitles_s": "sleep_interval_subtitles"}


def compile_url_patterns() -> None:
    """Compile every extractor's URL pattern now. yt-dlp compiles each the first time a URL is
    tried against it, and a URL is tried against them all in turn: 1.1 CPU-s in every process
    that first lists or downloads a URL. Done in a process that forks workers, it is done once
    for all of them."""
    for ie in yt_dlp.extractor.gen_extractor_classes():
        ie.suitable("")


def base_options(cfg: DownloadConfig, egress: Egress | None = None) -> dict[str, Any]:
    """Options every yt-dlp call gets, through ``egress`` (default: the first configured);
    secrets go in here and are never logged."""
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
    if cfg.preset:
        opts |= preset_options(cfg.preset)
    for key, option in _SLEEPS.items():
        if getattr(cfg, key) is not None:
            opts[option] = getattr(cfg, key)
    if opts.get("sleep_interval") and "max_sleep_interval" not in opts:
        opts["max_sleep_interval"] = opts["sleep_interval"]
    proxy = (egress or egresses(cfg)[0]).proxy
    if proxy is not None:
        opts["proxy"] = proxy.get_secret_value()
    if cfg.cookies_file:
        opts["cookiefile"] = cfg.cookies_file
    if cfg.cookies_from_browser:
        opts["cookiesfrombrowser"] = browser_cookies(cfg.cookies_from_browser)
    if cfg.extractor_args:
        opts["extractor_args"] = extractor_args(tuple(cfg.extractor_args))
    if cfg.user_agent:
        opts["http_headers"] = {"User-Agent": cfg.user_agent}
    if cfg.max_bandwidth:
        opts["ratelimit"] = parse_bytes(cfg.max_bandwidth)
    if cfg.max_filesize_mb:
        opts["max_filesize"] = int(cfg.max_filesize_mb * 1024 * 1024)
    return opts


@contextmanager
def youtube_dl(opts: dict[str, Any]) -> Iterator[yt_dlp.YoutubeDL]:
    """A YoutubeDL for one call. yt-dlp writes its cookie jar back to ``cookiefile`` when it
    closes; so it reads a private copy of the user's file (in a folder only this user reads),
    deleted after: the user's file is never written, a read-only one (a Kubernetes secret)
    works, and concurrent downloads share no file."""
    source = opts.get("cookiefile")
    if source is None:
        with yt_dlp.YoutubeDL(opts) as ydl:
            yield ydl
        return
    with tempfile.TemporaryDirectory(prefix="vlcorpus-cookies-") as folder:
        private = os.path.join(folder, "cookies.txt")
        shutil.copyfile(source, private)
        with yt_dlp.YoutubeDL({**opts, "cookiefile": private}) as ydl:
            yield ydl


def extract(url: str, opts: dict[str, Any], download: bool) -> dict[str, Any]:
    """``YoutubeDL.extract_info`` with yt-dlp errors turned into our error kinds."""
    try:
        with youtube_dl(opts) as ydl:
            info = ydl.extract_info(url, download=download)
            return ydl.sanitize_info(info)
    except (yt_dlp.utils.DownloadError, RequestError) as exc:
        # Most failures come wrapped in DownloadError; a few network errors (e.g. a redirect to
        # a file:// URL) come out of yt-dlp bare.
        raise _classified(exc) from None


_SUBTITLE_FAILED = re.compile(r"Unable to download video subtitles for '([^']+)'")


def _drop_track(result: dict[str, Any], lang: str, opts: dict[str, Any]) -> bool:
    """Remove the track of ``lang`` that yt-dlp chose (manual before auto), so that its next
    choice (the auto caption of the language, or nothing) is taken instead."""
    kinds = (["subtitles"] if opts.get("writesubtitles") else []) + ["automatic_captions"]
    for kind in kinds:
        if lang in (result.get(kind) or {}):
            del result[kind][lang]
            return True
    return False


def _track_fault(problem: StageError) -> bool:
    return problem.kind in (ErrorKind.PERMANENT, ErrorKind.BAD_INPUT) and not isinstance(
        problem, ForbiddenError)


def download(url: str, opts: dict[str, Any],
             unreadable: Callable[[dict[str, Any]], dict[str, str]]) -> tuple[dict[str, Any], list[str]]:
    """Extract and download a video with its subtitles, where a subtitle track that fails to
    download, or that ``unreadable(info)`` finds unreadable (it returns {lang: why} and removes
    those files), fails alone: yt-dlp's next choice for the language (its auto caption, or none)
    is taken instead, without extracting the video again. Returns the info and a note per
    track dropped."""
    dropped: list[str] = []
    try:
        with youtube_dl(opts) as ydl:
            result = ydl.extract_info(url, download=False, process=False)
            while True:
                try:
                    info = ydl.sanitize_info(ydl.process_ie_result(copy.deepcopy(result),
                                                                   download=True))
                except yt_dlp.utils.DownloadError as exc:
                    failed = _SUBTITLE_FAILED.search(str(exc))
                    # A track refused (a block, a 403) or cut off says nothing about the track.
                    if (failed is None or not _track_fault(_classified(exc))
                            or not _drop_track(result, failed[1], opts)):
                        raise
                    dropped.append(clean_message(str(exc)))
                    continue
                bad = unreadable(info)
                dropped += [f"subtitles for {lang!r} unreadable: {why}" for lang, why in bad.items()]
                if not any([_drop_track(result, lang, opts) for lang in bad]):
                    return info, dropped
    except (yt_dlp.utils.DownloadError, RequestError) as exc:
        raise _classified(exc) from None
