"""What one video's download leaves on disk: the options of its one yt-dlp call (media and
subtitles, named by video id), the subtitle tracks it wrote (a track that does not read is
dropped), the media file, and the caps on its size and its time; and a folder source's video,
referenced in place with its sidecar subtitles. The stage that runs them is
pipeline/download/stage.py.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from yt_dlp.utils import download_range_func

from pipeline.config import Config, DownloadConfig
from pipeline.download.ytdlp import Egress, base_options
from pipeline.errors import BadInputError, PermanentError
from pipeline.media import check_video
from pipeline.transcribe.subtitles import check_size, read_cues

SIDECAR_EXTENSIONS = (".vtt", ".srt")


def ytdlp_options(cfg: Config, workdir: str, vid: str, row: dict[str, Any],
                  egress: Egress | None = None) -> dict[str, Any]:
    """Options of the one yt-dlp call for a video: media + subtitles, named by video_id only."""
    dl = cfg.download
    opts = base_options(dl, egress) | {
        "format": dl.format,
        "outtmpl": {
            "default": f"{workdir}/media/{vid}.%(ext)s",
            "subtitle": f"{workdir}/subs/{vid}.%(ext)s",
        },
        "writesubtitles": dl.manual_subtitles,
        "writeautomaticsub": dl.auto_subtitles,
        "subtitleslangs": dl.subtitle_langs,
        "subtitlesformat": "vtt/best",
        "merge_output_format": "mp4",
        "continuedl": True,
        "overwrites": False,
    }
    if urlsplit(row["url"]).scheme.lower() == "file":
        # Only a file:// URL the list itself names (its scheme passed download.allowed_schemes):
        # pages fetched over the web never get to read local files.
        opts["enable_file_urls"] = True
    start, end = row.get("start_s"), row.get("end_s")
    if dl.partial and start is not None and end is not None:
        opts["download_ranges"] = download_range_func(None, [dl.section(start, end)])
    return opts


def _subtitle_path(workdir: str, vid: str, lang: str, sub: dict[str, Any]) -> str:
    # yt-dlp reports the path before its final move into the "subtitle" template's folder.
    return os.path.join(workdir, "subs", f"{vid}.{lang}.{sub.get('ext', 'vtt')}")


def unreadable_subtitles(info: dict[str, Any], workdir: str, vid: str) -> dict[str, str]:
    """{lang: why} of the downloaded tracks that do not read as subtitles; their files go."""
    bad = {}
    for lang, sub in (info.get("requested_subtitles") or {}).items():
        path = _subtitle_path(workdir, vid, lang, sub)
        if not os.path.exists(path):
            continue
        try:
            check_size(os.path.getsize(path))
            read_cues(Path(path).read_bytes())
        except BadInputError as exc:
            os.remove(path)
            bad[lang] = str(exc)
    return bad


def subtitle_rows(info: dict[str, Any], workdir: str, vid: str) -> list[dict[str, str]]:
    manual = set(info.get("subtitles") or {})
    rows = []
    for lang, sub in sorted((info.get("requested_subtitles") or {}).items()):
        path = _subtitle_path(workdir, vid, lang, sub)
        if os.path.exists(path):
            rows.append({"lang": lang, "kind": "manual" if lang in manual else "auto",
                         "path": os.path.relpath(path, workdir)})
    return rows


def media_path(info: dict[str, Any], notes: Sequence[str] = ()) -> str:
    downloads = info.get("requested_downloads") or []
    path = (downloads[0].get("filepath") if downloads else None) or info.get("filepath")
    if not path or not os.path.exists(path):
        # yt-dlp skips a file over max_filesize (as the server declares it) without an error.
        raise BadInputError(f"not downloaded: {notes[-1]}" if notes else "yt-dlp reported no media file")
    return path


class FileTooLarge(BadInputError):
    """The video's files grew past ``download.max_filesize_mb``: the same on every try."""


class DownloadTooSlow(PermanentError):
    """Still transferring after ``download.timeout_s``; ``--retry-failed`` tries it again."""


class Caps:
    """A yt-dlp progress hook that stops a download past ``download.max_filesize_mb`` (all files
    of the video together) or transferring for longer than ``download.timeout_s`` (from its
    first block on). yt-dlp checks the size only when the server declares it, and its socket
    timeout catches a server that goes silent, not one that trickles; this hook sees every
    block received."""

    def __init__(self, cfg: DownloadConfig) -> None:
        self.max_mb = cfg.max_filesize_mb
        self.timeout_s = cfg.timeout_s
        self.start: float | None = None
        self.received: dict[str, int] = {}
        self.files: set[str] = set()  # every file written, partial ones included

    def __call__(self, status: dict[str, Any]) -> None:
        names = [status.get("tmpfilename"), status.get("filename")]
        self.files.update(name for name in names if name)
        self.received[status.get("filename") or ""] = status.get("downloaded_bytes") or 0
        total = sum(self.received.values())
        if self.max_mb is not None and total > self.max_mb * 1024 * 1024:
            raise FileTooLarge(f"media is larger than download.max_filesize_mb ({self.max_mb:g} MB): "
                               f"stopped after {total} bytes")
        if self.start is None:
            self.start = time.monotonic()
        elif time.monotonic() - self.start > self.timeout_s:
            raise DownloadTooSlow(f"download took longer than download.timeout_s "
                                  f"({self.timeout_s:g} s): stopped after {total} bytes")


def remove_files(paths: Sequence[str]) -> None:
    for path in paths:
        if path and os.path.exists(path):
            os.remove(path)


def file_path(row: dict[str, Any]) -> str:
    return unquote(urlsplit(row["url"]).path)


def local_file(row: dict[str, Any]) -> dict[str, Any]:
    """A file already on disk (folder source): referenced in place, with its sidecars."""
    path = file_path(row)
    if not os.path.isfile(path):
        raise PermanentError(f"file not found: {path}")
    probe = check_video(path)
    stem = os.path.splitext(path)[0]
    subs = []
    # Escaped: a name like "tour [2019].mp4" is no pattern.
    for candidate in sorted(Path(path).parent.glob(glob.escape(Path(stem).name) + ".*")):
        name = candidate.name[len(Path(stem).name):]  # ".en.vtt" or ".srt"
        if candidate.suffix.lower() in SIDECAR_EXTENSIONS:
            lang = name[1:].rsplit(".", 1)[0] if name.count(".") > 1 else "und"
            subs.append({"lang": lang, "kind": "manual", "path": str(candidate)})
    return {
        "video_id": row["video_id"],
        "media_path": path,
        "subtitles": subs,
        "format_id": None,
        "width": probe.width,
        "height": probe.height,
        "fps": probe.fps,
        "duration_s": probe.duration_s,
        "bytes": os.path.getsize(path),
        "has_audio": probe.has_audio,
        "status": "ok",
        "downloaded_at": datetime.now(UTC),
    }
