"""The download stage: videos in; media/, subs/ and one ``downloads`` row per video out.

One yt-dlp call per video fetches the media and its subtitles together (manual first, auto
as fallback). The file is checked before the row counts as done; a bad file is removed and
becomes an errors row. Concurrency is bounded cluster-wide by ``download.concurrency``.
"""

from __future__ import annotations

import glob
import os
import posixpath
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from yt_dlp.utils import download_range_func

from pipeline.config import Config, DownloadConfig
from pipeline.discover import scheme_problem
from pipeline.errors import BadInputError, PermanentError
from pipeline.limits import slot
from pipeline.media import check_video
from pipeline.retention import needed_again
from pipeline.runner import Item, Outcome, Stage, StageContext, per_item, table_inputs
from pipeline.storage import Corpus
from pipeline.ytdlp import base_options, extract

SIDECAR_EXTENSIONS = (".vtt", ".srt")


def ytdlp_options(cfg: Config, workdir: str, vid: str, row: dict[str, Any]) -> dict[str, Any]:
    """Options of the one yt-dlp call for a video: media + subtitles, named by video_id only."""
    dl = cfg.download
    opts = base_options(dl) | {
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
        pad = dl.section_padding_s
        opts["download_ranges"] = download_range_func(None, [(max(0.0, start - pad), end + pad)])
    return opts


def _subtitle_rows(info: dict[str, Any], workdir: str, vid: str) -> list[dict[str, str]]:
    manual = set(info.get("subtitles") or {})
    rows = []
    for lang, sub in sorted((info.get("requested_subtitles") or {}).items()):
        # yt-dlp reports the path before its final move into the "subtitle" template's folder.
        path = os.path.join(workdir, "subs", f"{vid}.{lang}.{sub.get('ext', 'vtt')}")
        if os.path.exists(path):
            rows.append({"lang": lang, "kind": "manual" if lang in manual else "auto",
                         "path": os.path.relpath(path, workdir)})
    return rows


def _media_path(info: dict[str, Any], notes: Sequence[str] = ()) -> str:
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


class _Caps:
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


def _remove(paths: Sequence[str]) -> None:
    for path in paths:
        if path and os.path.exists(path):
            os.remove(path)


def _fetch(row: dict[str, Any], cfg: Config, workdir: str) -> dict[str, Any]:
    vid = row["video_id"]
    opts = ytdlp_options(cfg, workdir, vid, row)
    with slot(cfg.download.concurrency_limit, cfg.download.concurrency):
        caps = _Caps(cfg.download)
        opts["progress_hooks"] = [caps]
        try:
            info = extract(row["url"], opts, download=True)
        except (FileTooLarge, DownloadTooSlow):
            # Nothing to resume: the next try would stop at the same cap.
            _remove(sorted(caps.files | {f"{name}.part" for name in caps.files}))
            raise
    media = _media_path(info, opts["logger"].notes)
    subs = _subtitle_rows(info, workdir, vid)
    try:
        probe = check_video(media)
    except BadInputError:
        _remove([media] + [os.path.join(workdir, s["path"]) for s in subs])
        raise
    return {
        "video_id": vid,
        "media_path": os.path.relpath(media, workdir),
        "subtitles": subs,
        "format_id": info.get("format_id"),
        "width": probe.width,
        "height": probe.height,
        "fps": probe.fps,
        "duration_s": probe.duration_s,
        "bytes": os.path.getsize(media),
        "has_audio": probe.has_audio,
        "status": "partial" if "download_ranges" in opts else "ok",
        "downloaded_at": datetime.now(UTC),
    }


def _local(row: dict[str, Any]) -> dict[str, Any]:
    """A file already on disk (folder source): referenced in place, with its sidecars."""
    path = unquote(urlsplit(row["url"]).path)
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


def _upload(corpus: Corpus, workdir: str, result: dict[str, Any]) -> None:
    """Move files fetched into a local scratch dir to a remote corpus root."""
    for rel in [result["media_path"], *(s["path"] for s in result["subtitles"])]:
        corpus.fs.makedirs(posixpath.dirname(corpus.path(rel)), exist_ok=True)
        corpus.fs.put(os.path.join(workdir, rel), corpus.path(rel))


def download_one(item: Item, ctx: StageContext) -> list[dict[str, Any]]:
    cfg: Config = ctx.config
    row = item.rows[0]
    problem = scheme_problem(row["url"], cfg.download.allowed_schemes, row["source"])
    if problem:
        raise BadInputError(problem)
    if row["source"] == "folder":
        return [_local(row)]
    corpus = ctx.corpus
    if corpus.is_local:
        return [_fetch(row, cfg, corpus.local_path())]
    # A remote root: fetch to scratch space, then upload.
    with tempfile.TemporaryDirectory(prefix="vlcorpus-dl-") as workdir:
        result = _fetch(row, cfg, workdir)
        _upload(corpus, workdir, result)
        return [result]


def process(items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
    """Download a batch with up to ``download.concurrency`` videos in flight."""
    one = per_item(download_one)
    with ThreadPoolExecutor(max_workers=ctx.config.download.concurrency) as pool:
        return [o for outcomes in pool.map(lambda i: one([i], ctx), items) for o in outcomes]


STAGE = Stage(name="download", output="downloads", source="videos", inputs=table_inputs("videos"),
              process=process, redo=needed_again)
