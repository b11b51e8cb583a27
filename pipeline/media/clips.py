"""Clips cut out of videos: a video's clips in one ffmpeg process (stream copy) or in a few
(frame-exact re-encode), several processes at once, each output checked before it is renamed
into place."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import av
import ffmpeg

from pipeline.errors import BadInputError
from pipeline.media.frames import END_SLACK_S, TIME_EPS
from pipeline.media.probe import MediaInfo, probe
from pipeline.media.process import FfmpegRun, run_ffmpeg
from pipeline.progress import beat, carried

# ffmpeg frees an encoder only when it exits, and an x264 encoder holds ~35 MB at 640x360: exact
# cuts of one video share a process by groups of this many clips (by start time) to bound memory.
EXACT_CLIPS_PER_PROCESS = 16

# Audio an exact cut copies (into MP4) instead of encoding it again: an AAC encode of every
# clip's sound was an eighth of the CPU of cutting web video. A copied track starts and ends on
# a packet of the source (an AAC packet is 1024 samples: 23 ms at 44.1 kHz), which may run past
# the clip's last frame by up to COPIED_AUDIO_SLACK_S.
COPY_AUDIO_CODECS = frozenset({"aac", "mp3", "ac3", "eac3", "alac"})
COPIED_AUDIO_SLACK_S = 0.1


@dataclass(frozen=True)
class ClipCut:
    key: str
    start_s: float
    end_s: float
    out_path: str


def cut_clips(path: str, cuts: Sequence[ClipCut], precision: Literal["copy", "exact"] = "exact",
              height: int | None = None, fps: float | None = None, codec: str = "libx264",
              audio: bool = False, timeout_s: float = 600,
              processes: int | None = None) -> dict[str, str | BadInputError]:
    """Cut ``cuts`` out of ``path``: ``cut_videos`` with one video."""
    return cut_videos([(path, cuts)], precision, height, fps, codec, audio, timeout_s, processes)


def cut_videos(videos: Sequence[tuple[str, Sequence[ClipCut]]], precision: Literal["copy", "exact"] = "exact",
               height: int | None = None, fps: float | None = None, codec: str = "libx264",
               audio: bool = False, timeout_s: float = 600,
               processes: int | None = None) -> dict[str, str | BadInputError]:
    """Cut each video's clips (``(path, cuts)`` pairs) with ``processes`` ffmpeg processes at
    once (None: one per CPU core), the longest first; returns each key's output path, or a
    BadInputError for that key (or for every key of a video that is unreadable).

    ``copy`` cuts all clips of a video in one process; ``exact`` decodes a run of clips (by
    start time) once per process, at most EXACT_CLIPS_PER_PROCESS of them, in runs short enough
    that every process has work. Processes side by side share the cores: each decodes and
    encodes with cores / ``processes`` threads (one per process at one per core: four
    one-minute 480p videos cut two at a time took 35.7 CPU-s so, 39.5 with ffmpeg's own thread
    count). ``timeout_s`` is per process.

    ``exact`` re-encodes the video (``codec``, veryfast, yuv420p, faststart) and is
    frame-accurate: the video lasts the requested time within one frame; ``height`` scales
    keeping the aspect (even width) and ``fps`` resamples. Its audio is copied when MP4 takes
    the source's codec (``COPY_AUDIO_CODECS``; to the packet, which may run past the last frame
    by ``COPIED_AUDIO_SLACK_S`` at most), else encoded again (to the sample). ``copy`` copies
    the streams without re-encoding, so a clip starts at the last keyframe at or before its
    start (up to one GOP early), may end a few frames late (B-frame reordering), and
    ``height``/``fps``/``codec`` do not apply.
    ``audio`` keeps the first audio track when there is one. Outputs appear under their names
    only when whole.
    """
    every = [cut for _, cuts in videos for cut in cuts]
    _check_cuts(every, precision, height)
    processes = processes or os.cpu_count() or 1
    threads = max(1, (os.cpu_count() or 1) // processes) if processes > 1 else None
    per_run = max(1, min(EXACT_CLIPS_PER_PROCESS, math.ceil(len(every) / processes)))
    results: dict[str, str | BadInputError] = {}
    jobs: list[_Job] = []
    for path, cuts in videos:
        try:
            info = probe(path)
            if not info.has_video:
                raise BadInputError("no video stream")
            results |= {cut.key: BadInputError(f"clip {cut.start_s:.2f}-{cut.end_s:.2f}s ends after the "
                                               f"media ({info.duration_s:.2f}s)")
                        for cut in cuts if cut.end_s > info.duration_s + END_SLACK_S}
            todo = [cut for cut in cuts if cut.key not in results]
            if todo:
                jobs += _jobs(path, todo, info, precision, height, fps, codec, audio and info.has_audio,
                              per_run, threads)
        except BadInputError as exc:  # the video (unreadable) or its keyframe index
            results |= {cut.key: exc for cut in cuts if cut.key not in results}
    jobs.sort(key=lambda job: -job.seconds)
    def cut(job: _Job) -> FfmpegRun:
        run = run_ffmpeg(job.args, timeout_s)
        beat()
        return run

    with ThreadPoolExecutor(processes) as pool:
        runs = list(pool.map(carried(cut), jobs))
    for job, run in zip(jobs, runs):
        error = run.reason if run.failed else ""
        results |= {cut.key: _keep_output(cut, job.want_s[cut.key], job.frame_s, job.slack_s,
                                          precision == "exact", error)
                    for cut in job.cuts}
    return {cut.key: results[cut.key] for cut in every}


@dataclass(frozen=True)
class _Job:
    """One ffmpeg process: the clips it writes, its arguments, and what each output should last."""

    cuts: Sequence[ClipCut]
    args: list[str]
    want_s: dict[str, float]
    frame_s: float
    slack_s: float  # how much longer than wanted an exact output may be

    @property
    def seconds(self) -> float:
        return sum(self.want_s.values())


def _jobs(path: str, cuts: Sequence[ClipCut], info: MediaInfo, precision: str, height: int | None,
          fps: float | None, codec: str, with_audio: bool, per_run: int, threads: int | None) -> list[_Job]:
    for cut in cuts:
        os.makedirs(os.path.dirname(cut.out_path) or ".", exist_ok=True)
    copy_audio = with_audio and precision == "exact" and info.audio_codec in COPY_AUDIO_CODECS
    if precision == "copy":
        starts = dict(zip([cut.key for cut in cuts], _copy_starts(path, [cut.start_s for cut in cuts])))
        source = ffmpeg.input(path)
        groups = [(list(cuts), [_copy_output(source, cut, starts[cut.key], with_audio) for cut in cuts])]
    else:
        starts = {cut.key: cut.start_s for cut in cuts}
        by_start = sorted(cuts, key=lambda cut: cut.start_s)
        # Runs of near-equal length: 17 clips go as 9 + 8, not 16 + 1.
        count = math.ceil(len(by_start) / per_run)
        bounds = [round(i * len(by_start) / count) for i in range(count + 1)]
        groups = [(group, _exact_outputs(path, group, height, fps, codec, with_audio, copy_audio, threads))
                  for group in (by_start[a:b] for a, b in zip(bounds, bounds[1:]))]
    frame_s = 1 / ((fps if precision == "exact" else None) or info.fps or 25)
    slack_s = max(frame_s, COPIED_AUDIO_SLACK_S) if copy_audio else frame_s
    return [_Job(group, ffmpeg.merge_outputs(*outputs).get_args(),
                 {cut.key: min(cut.end_s, info.duration_s) - max(starts[cut.key], 0) for cut in group},
                 frame_s, slack_s)
            for group, outputs in groups]


def _check_cuts(cuts: Sequence[ClipCut], precision: str, height: int | None) -> None:
    if precision not in ("copy", "exact"):
        raise ValueError(f"precision must be 'copy' or 'exact', not {precision!r}")
    if height is not None and (height <= 0 or height % 2):
        raise ValueError("height must be a positive even number (yuv420p)")
    if len({cut.key for cut in cuts}) != len(cuts):
        raise ValueError("cut keys must be unique")
    for cut in cuts:
        if not 0 <= cut.start_s < cut.end_s:
            raise ValueError(f"{cut.key}: needs 0 <= start < end")


def _part_path(out_path: str) -> str:
    """Where ffmpeg writes ``out_path`` until it is whole (same folder, same extension)."""
    root, ext = os.path.splitext(out_path)
    return f"{root}.part{ext}"


def _copy_starts(path: str, times: Sequence[float]) -> list[float]:
    """The -ss of each copied clip: just before (1 ms, against rounding) the decode time of the
    last video keyframe at or before its start, found by seeking (the container's index, no
    decoding). A copy drops packets decoded before -ss and then all up to the first keyframe,
    so the clip starts at that keyframe. Negative: the keyframe is the first packet."""
    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            offset = (container.start_time or 0) / 1e6
            base = float(stream.time_base)
            starts = []
            for time_s in times:
                container.seek(int((time_s + offset) / base), stream=stream, backward=True)
                packet = next((p for p in container.demux(stream) if p.is_keyframe and p.dts is not None),
                              None)
                keyframe_s = min(time_s, packet.dts * base - offset) if packet else time_s
                starts.append(keyframe_s - 0.001)
            return starts
    except av.FFmpegError as exc:
        raise BadInputError(f"unreadable media: {exc}") from None


def _copy_output(source: ffmpeg.nodes.FilterableStream, cut: ClipCut, start: float,
                 with_audio: bool) -> ffmpeg.nodes.OutputStream:
    # Output-side -ss/-t: every clip reads the one shared input. No -ss before the first packet:
    # -ss 0 would drop a keyframe decoded at a negative time (B-frames).
    streams = [source["v:0"]] + ([source["a:0"]] if with_audio else [])
    seek = {"ss": f"{start:.6f}"} if start > 0 else {}
    return ffmpeg.output(*streams, _part_path(cut.out_path), **seek, t=f"{cut.end_s - max(start, 0):.6f}",
                         c="copy", movflags="+faststart")


def _exact_outputs(path: str, cuts: Sequence[ClipCut], height: int | None, fps: float | None,
                   codec: str, with_audio: bool, copy_audio: bool,
                   threads: int | None) -> list[ffmpeg.nodes.OutputStream]:
    # One decode feeds every clip: split the stream, trim each branch, restart its clock. The
    # input is entered (frame-accurately) at the first clip: time 0 of the graph is that start.
    # Copied audio comes from an input of its own per clip, entered at the clip's start (at the
    # packet that holds it) and cut at its length.
    origin = min(cut.start_s for cut in cuts)
    threaded = {"threads": threads} if threads else {}  # None: ffmpeg's own choice
    source = ffmpeg.input(path, ss=f"{origin:.6f}", **threaded)
    videos = source["v:0"].split()
    audios = source["a:0"].asplit() if with_audio and not copy_audio else None
    encoder = {"vcodec": codec, "pix_fmt": "yuv420p", "movflags": "+faststart", **threaded}
    if codec in ("libx264", "libx265"):
        encoder["preset"] = "veryfast"
    outputs = []
    for i, cut in enumerate(cuts):
        start, end = cut.start_s - origin, cut.end_s - origin
        video = videos[i].trim(start=start, end=end).setpts("PTS-STARTPTS")
        if fps:
            video = video.filter("fps", fps=fps)
        # Even sizes for yuv420p; -2 keeps the aspect with an even width.
        video = video.filter("scale", -2, height) if height else video.filter(
            "scale", "trunc(iw/2)*2", "trunc(ih/2)*2")
        if copy_audio:
            sound = ffmpeg.input(path, ss=f"{cut.start_s:.6f}")["a:0"]
            outputs.append(ffmpeg.output(video, sound, _part_path(cut.out_path), t=f"{end - start:.6f}",
                                         acodec="copy", **encoder))
            continue
        streams = [video]
        if audios is not None:
            streams.append(audios[i].filter("atrim", start=start, end=end)
                           .filter("asetpts", "PTS-STARTPTS"))
        outputs.append(ffmpeg.output(*streams, _part_path(cut.out_path), **encoder))
    return outputs


def _duration(path: str) -> float:
    """What ffprobe calls the format duration, read in-process: an ffprobe per clip would take
    longer than cutting a clip."""
    try:
        with av.open(path) as container:
            return (container.duration or 0) / 1e6
    except (av.FFmpegError, OSError) as exc:
        raise BadInputError(f"unreadable output: {exc}") from None


def _keep_output(cut: ClipCut, want_s: float, frame_s: float, slack_s: float, exact: bool,
                 ffmpeg_error: str) -> str | BadInputError:
    """Rename a whole output into place; a missing or wrongly long one is bad input."""
    part = _part_path(cut.out_path)
    try:
        got = _duration(part)
    except BadInputError as exc:
        problem = ffmpeg_error or str(exc)
    else:
        # Exact cuts last the request within a frame; copies may start up to a GOP early.
        short = got < want_s - frame_s - TIME_EPS
        if not short and not (exact and got > want_s + slack_s + TIME_EPS):
            os.replace(part, cut.out_path)
            return cut.out_path
        problem = f"output lasts {got:.3f}s, wanted {want_s:.3f}s" + (f" ({ffmpeg_error})" if ffmpeg_error else "")
    if os.path.exists(part):
        os.remove(part)
    return BadInputError(f"cutting {cut.start_s:.2f}-{cut.end_s:.2f}s failed: {problem}")
