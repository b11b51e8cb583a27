"""Media with ffprobe/ffmpeg (ffmpeg-python) and PyAV: what a file holds, whether it is whole, its
audio, the frames each clip needs (one decode per video), and its clips cut out (one ffmpeg per video)."""

from __future__ import annotations

import math
import os
import subprocess
import wave
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Literal

import av
import ffmpeg
import numpy as np

from pipeline.errors import BadInputError


@dataclass(frozen=True)
class MediaInfo:
    duration_s: float
    has_video: bool
    has_audio: bool
    width: int | None = None
    height: int | None = None
    fps: float | None = None


def _rate(text: str | None) -> float | None:
    try:
        value = float(Fraction(text)) if text else None
    except (ValueError, ZeroDivisionError):
        return None
    return value or None


def probe(path: str) -> MediaInfo:
    """Streams and duration of a media file; unreadable files are bad input."""
    try:
        data = ffmpeg.probe(path)
    except ffmpeg.Error as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise BadInputError(f"unreadable media: {detail[-1] if detail else exc}") from None
    streams = data.get("streams", [])
    video = next((s for s in streams if s.get("codec_type") == "video"
                  and not s.get("disposition", {}).get("attached_pic")), None)
    audio = next((s for s in streams if s.get("codec_type") == "audio"), None)
    try:
        duration = float(data.get("format", {}).get("duration") or 0.0)
    except ValueError:
        duration = 0.0
    return MediaInfo(
        duration_s=duration if duration == duration else 0.0,  # NaN counts as unknown
        has_video=video is not None,
        has_audio=audio is not None,
        width=video.get("width") if video else None,
        height=video.get("height") if video else None,
        fps=_rate(video.get("avg_frame_rate") or video.get("r_frame_rate")) if video else None,
    )


# A container may claim a duration this much longer than its video stream lasts and keep it
# (audio that runs on a little); beyond it the claim is metadata gone wrong.
DURATION_SLACK_S = 1.0


def video_end(path: str) -> float | None:
    """Where the first video stream really ends, in seconds from the media start: the end of
    its last packet, read from the packets after the last keyframe (no decoding), not from
    metadata. None when the stream has no packets."""
    try:
        with av.open(path) as container:
            if not container.streams.video:
                return None
            stream = container.streams.video[0]
            offset = (container.start_time or 0) / 1e6
            base = float(stream.time_base)
            end = None
            # Seeking far past the end lands on the last keyframe the index knows; without an
            # index (or when the seek lands after every packet) read the stream from the start.
            for seek_to in (2**62, 0):
                try:
                    container.seek(seek_to, stream=stream, backward=True)
                except av.FFmpegError:
                    continue
                for packet in container.demux(stream):
                    if packet.pts is not None:
                        packet_end = (packet.pts + (packet.duration or 0)) * base - offset
                        end = packet_end if end is None else max(end, packet_end)
                if end is not None:
                    break
            return end
    except (av.FFmpegError, OSError) as exc:
        raise BadInputError(f"unreadable media: {exc}") from None


def check_video(path: str, timeout_s: float = 120.0) -> MediaInfo:
    """A video stream with frames, an end that decodes (catches cut files), and a duration
    from the stream itself when the metadata has none, or claims far more than the stream holds
    (NaN, 1e9 s): downstream stages cut clips up to ``duration_s``."""
    info = probe(path)
    if not info.has_video:
        raise BadInputError("no video stream")
    # Decode the last second: a file cut short after its index still probes fine.
    cmd = ["ffmpeg", "-nostdin", "-v", "error", "-sseof", "-1", "-i", path, "-map", "0:v:0",
           "-f", "null", "-"]
    try:
        result = subprocess.run(cmd, capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise BadInputError(f"decoding the end of the file took over {timeout_s:.0f}s") from None
    errors = result.stderr.decode(errors="replace").strip()
    if result.returncode != 0 or errors:
        first = errors.splitlines()[0] if errors else f"ffmpeg exit {result.returncode}"
        raise BadInputError(f"truncated or corrupt media: {first}")
    end = video_end(path)
    if end is None:
        raise BadInputError("the video stream has no frames")
    if end <= 0:
        raise BadInputError("duration is 0")
    if not 0 < info.duration_s <= end + DURATION_SLACK_S:
        return replace(info, duration_s=end)
    return info


def extract_audio(path: str, out_wav: str, sample_rate: int = 16000) -> float:
    """Write the first audio stream of ``path`` to ``out_wav`` as mono 16-bit PCM WAV at
    ``sample_rate`` Hz; returns the WAV's duration in seconds. A file without audio, or one
    ffmpeg cannot decode, is bad input."""
    info = probe(path)
    if not info.has_audio:
        raise BadInputError("no audio stream")
    stream = (
        ffmpeg.input(path)["a:0"]
        .output(out_wav, format="wav", acodec="pcm_s16le", ac=1, ar=sample_rate)
        .global_args("-nostdin", "-hide_banner", "-loglevel", "error")
        .overwrite_output()
    )
    try:
        stream.run(capture_stdout=True, capture_stderr=True)
    except ffmpeg.Error as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        raise BadInputError(
            f"audio extraction failed: {detail[-1] if detail else 'ffmpeg exited non-zero'}"
        ) from None
    try:
        with wave.open(out_wav, "rb") as wav:
            return wav.getnframes() / float(wav.getframerate())
    except (OSError, EOFError, wave.Error) as exc:
        raise BadInputError(f"audio extraction wrote an unreadable WAV: {exc}") from None


# --- Frame sampling -------------------------------------------------------------------------

END_SLACK_S = 0.5  # a time this far past the last frame still takes the last frame
SEEK_MIN_S = 1.0  # seek only past this much video: a seek flushes the frames being decoded
_EPS = 1e-6  # float slack when comparing sample times with frame times


@dataclass(frozen=True)
class FrameSpec:
    """How one feature extractor wants its frames: ``fps`` over the clip, or exactly
    ``frames`` spread uniformly; resized so the short side is ``short_side``, then centre
    cropped to ``crop`` x ``crop`` (None: no crop)."""

    fps: float | None = None
    frames: int | None = None
    short_side: int = 256
    crop: int | None = 224


@dataclass(frozen=True)
class FrameRequest:
    key: str  # who asked, e.g. "<clip_id>" or "<clip_id>|<extractor>"
    start_s: float
    end_s: float
    spec: FrameSpec


def frame_times(request: FrameRequest) -> list[float]:
    """Sample times of a request: with ``fps``, at start + (i + 0.5) / fps while before the end
    (at least one, the clip's middle); with ``frames=N``, the centres of N equal parts."""
    spec, start, end = request.spec, request.start_s, request.end_s
    if (spec.fps is None) == (spec.frames is None):
        raise ValueError(f"{request.key}: set exactly one of fps and frames")
    if (spec.fps is not None and spec.fps <= 0) or (spec.frames is not None and spec.frames < 1):
        raise ValueError(f"{request.key}: fps and frames must be positive")
    if end < start:
        raise ValueError(f"{request.key}: ends before it starts")
    if spec.crop is not None and spec.crop > spec.short_side:
        raise ValueError(f"{request.key}: crop {spec.crop} is larger than short side {spec.short_side}")
    if spec.frames is not None:
        step = (end - start) / spec.frames
        return [start + (i + 0.5) * step for i in range(spec.frames)]
    candidates = (start + (i + 0.5) / spec.fps for i in range(math.ceil((end - start) * spec.fps)))
    return [t for t in candidates if t < end] or [(start + end) / 2]


def _resized_size(width: int, height: int, short_side: int) -> tuple[int, int]:
    scale = short_side / min(width, height)
    return max(1, round(width * scale)), max(1, round(height * scale))


def _centre_crop(image: np.ndarray, crop: int | None) -> np.ndarray:
    if crop is None:
        return image
    top, left = (image.shape[0] - crop) // 2, (image.shape[1] - crop) // 2
    return image[top:top + crop, left:left + crop]


def _to_rgb(frame: av.VideoFrame, size: tuple[int, int]) -> np.ndarray:
    return frame.reformat(width=size[0], height=size[1], format="rgb24").to_ndarray()


class _Collector:
    """The frames of all requests of one video. Sample times of every request are merged into
    one sorted list, so each decoded frame costs one comparison; a frame is converted only when
    some time falls on it, once per output size, on ``pool`` while decoding goes on (swscale
    and the decoder release the GIL; the conversion is the expensive part)."""

    def __init__(self, requests: Sequence[FrameRequest], pool: Executor) -> None:
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("request keys must be unique")
        self.pool = pool
        times = {r.key: frame_times(r) for r in requests}
        self.requests = {r.key: r for r in requests}
        self.wanted = {key: len(t) for key, t in times.items()}
        # Per open request: its frames so far, as (resized image to come, quarter turns).
        self.frames: dict[str, list[tuple[Future[np.ndarray], int]]] = {r.key: [] for r in requests}
        # Decode order: by time, then by clip start, so earlier clips complete first.
        by_start = sorted(requests, key=lambda r: (r.start_s, r.end_s))
        self.events = sorted((t, i, r.key) for i, r in enumerate(by_start) for t in times[r.key])
        self.pos = 0
        self.last: tuple[float, av.VideoFrame] | None = None  # newest frame, shown until the next

    def next_time(self) -> float | None:
        """The earliest sample time not yet served."""
        return self.events[self.pos][0] if self.pos < len(self.events) else None

    def add(self, time_s: float, frame: av.VideoFrame) -> Iterator[tuple[str, np.ndarray]]:
        """A new frame shown from ``time_s``: times before it fall on the previous frame (or on
        this one, when it is the first)."""
        shown = self.last or (time_s, frame)
        yield from self._serve(shown[1], until=time_s - _EPS)
        self.last = (time_s, frame)

    def finish(self) -> Iterator[tuple[str, np.ndarray | BadInputError]]:
        """The media ended: times shortly after the last frame take it, the rest fail."""
        if self.last is not None:
            yield from self._serve(self.last[1], until=self.last[0] + END_SLACK_S)
        end = f"{self.last[0]:.2f}s" if self.last else "its start (no frames decoded)"
        yield from self.fail(f"media ends at {end}, before the requested frames")

    def fail(self, message: str) -> Iterator[tuple[str, BadInputError]]:
        """Every request still open fails with ``message``."""
        for key, request in self.requests.items():
            del self.frames[key]
            yield key, BadInputError(f"{message} (wanted {request.start_s:.2f}-{request.end_s:.2f}s)")
        self.requests.clear()

    def _serve(self, frame: av.VideoFrame, until: float) -> Iterator[tuple[str, np.ndarray]]:
        resized: dict[tuple[int, int], Future[np.ndarray]] = {}  # one conversion per size
        while self.pos < len(self.events) and self.events[self.pos][0] < until:
            key = self.events[self.pos][2]
            self.pos += 1
            if key not in self.frames:  # already failed
                continue
            size = _resized_size(frame.width, frame.height, self.requests[key].spec.short_side)
            if size not in resized:
                resized[size] = self.pool.submit(_to_rgb, frame, size)
            self.frames[key].append((resized[size], round(frame.rotation / 90)))
            if len(self.frames[key]) == self.wanted[key]:
                crop = self.requests.pop(key).spec.crop
                yield key, np.stack([np.rot90(_centre_crop(image.result(), crop), k=turns)
                                     for image, turns in self.frames.pop(key)])


def _decoded(container: av.container.InputContainer, stream: av.VideoStream,
             next_time: Callable[[], float | None]) -> Iterator[tuple[float, av.VideoFrame]]:
    """Frames in display order with their time from the media start, until nothing more is
    wanted. Still one forward pass, but frames nobody wants are skipped by seeking to the last
    keyframe before the next wanted time, when the index shows one well ahead of us."""
    offset = (container.start_time or 0) / 1e6  # the time origin ffmpeg and ffprobe use
    base = float(stream.time_base)
    position = float("-inf")  # time of the newest frame handed out
    seeking = True
    seeked_from: float | None = None
    while True:
        jumped = False
        for frame in container.decode(stream):
            if frame.pts is None:
                continue
            time_s = frame.pts * base - offset
            if seeked_from is not None:
                # A seek that lands at or before where we were (the index lists decode times,
                # and a keyframe shows a little later) gains nothing: read straight on.
                seeking = seeking and time_s > seeked_from
                seeked_from = None
            if time_s <= position:
                continue
            position = time_s
            yield time_s, frame
            wanted = next_time()
            if wanted is None:
                return
            if seeking and wanted - time_s > SEEK_MIN_S and _seek_ahead(
                    container, stream, time_s + offset, wanted + offset):
                seeked_from = time_s
                jumped = True
                break
        if not jumped:
            return


def _seek_ahead(container: av.container.InputContainer, stream: av.VideoStream,
                now: float, target: float) -> bool:
    """Seek to the keyframe at or before ``target`` if the index has one well after ``now``."""
    entries = stream.index_entries
    if not len(entries):
        return False
    base = float(stream.time_base)
    index = entries.search_timestamp(int(target / base), backward=True)
    # The index lists every packet; decoding can only restart at a keyframe.
    while index >= 0 and not entries[index].is_keyframe:
        index -= 1
    if index < 0 or entries[index].timestamp * base <= now + SEEK_MIN_S:
        return False
    # Seek by display time: ffmpeg lands on the last keyframe shown at or before ``target``.
    container.seek(int(target / base), stream=stream, backward=True)
    return True


def sample_frames(path: str, requests: Sequence[FrameRequest],
                  threads: int = 0) -> Iterator[tuple[str, np.ndarray | BadInputError]]:
    """Decode ``path`` once and yield ``(key, uint8 [T, H, W, 3] RGB)`` for each request as soon
    as its frames are in, or ``(key, BadInputError)`` when the file is unreadable, decoding fails,
    or the media ends before the request's times. Each time takes the frame shown then (the last
    with pts <= t). Only frames of requests still open are held. ``threads``: decoder threads
    (0: FFmpeg's choice)."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        collector = _Collector(requests, pool)
        if not requests:
            return
        try:
            container = av.open(path)
        except (av.FFmpegError, OSError) as exc:
            yield from collector.fail(f"unreadable media: {exc}")
            return
        with container:
            yield from _sample(container, collector, threads)


def _sample(container: av.container.InputContainer, collector: _Collector,
            threads: int) -> Iterator[tuple[str, np.ndarray | BadInputError]]:
    """Decode the first video stream of an open container into ``collector``."""
    if not container.streams.video:
        yield from collector.fail("no video stream")
        return
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    stream.codec_context.thread_count = threads
    try:
        for time_s, frame in _decoded(container, stream, collector.next_time):
            yield from collector.add(time_s, frame)
        yield from collector.finish()
    except av.FFmpegError as exc:
        yield from collector.fail(f"decoding failed: {exc}")


# --- Clip cutting ---------------------------------------------------------------------------

# ffmpeg frees an encoder only when it exits, and an x264 encoder holds ~35 MB at 640x360: exact
# cuts of one video share a process by groups of this many clips (by start time) to bound memory.
EXACT_CLIPS_PER_PROCESS = 16


@dataclass(frozen=True)
class ClipCut:
    key: str
    start_s: float
    end_s: float
    out_path: str


def cut_clips(path: str, cuts: Sequence[ClipCut], precision: Literal["copy", "exact"] = "exact",
              height: int | None = None, fps: float | None = None, codec: str = "libx264",
              audio: bool = False, timeout_s: float = 600) -> dict[str, str | BadInputError]:
    """Cut ``cuts`` out of ``path`` with one ffmpeg process (``exact``: one per
    EXACT_CLIPS_PER_PROCESS clips; ``timeout_s`` is per process); returns each key's output
    path, or a BadInputError for that key (or for every key when the input is unreadable).

    ``exact`` re-encodes (``codec``, veryfast, yuv420p, faststart) and is frame-accurate: the
    output lasts the requested time within one frame; ``height`` scales keeping the aspect
    (even width) and ``fps`` resamples. ``copy`` copies the streams without re-encoding, so a
    clip starts at the last keyframe at or before its start (up to one GOP early), may end a
    few frames late (B-frame reordering), and ``height``/``fps``/``codec`` do not apply.
    ``audio`` keeps the first audio track when there is one. Outputs appear under their names
    only when whole.
    """
    _check_cuts(cuts, precision, height)
    try:
        info = probe(path)
        if not info.has_video:
            raise BadInputError("no video stream")
    except BadInputError as exc:
        return {cut.key: exc for cut in cuts}
    results: dict[str, str | BadInputError] = {
        cut.key: BadInputError(f"clip {cut.start_s:.2f}-{cut.end_s:.2f}s ends after the media "
                               f"({info.duration_s:.2f}s)")
        for cut in cuts if cut.end_s > info.duration_s + END_SLACK_S}
    todo = [cut for cut in cuts if cut.key not in results]
    if todo:
        try:
            results |= _cut(path, todo, info, precision, height, fps, codec, audio, timeout_s)
        except BadInputError as exc:
            results |= {cut.key: exc for cut in todo}
    return {cut.key: results[cut.key] for cut in cuts}


def _cut(path: str, cuts: Sequence[ClipCut], info: MediaInfo, precision: str, height: int | None,
         fps: float | None, codec: str, audio: bool, timeout_s: float) -> dict[str, str | BadInputError]:
    with_audio = audio and info.has_audio
    for cut in cuts:
        os.makedirs(os.path.dirname(cut.out_path) or ".", exist_ok=True)
    if precision == "copy":
        starts = dict(zip([cut.key for cut in cuts], _copy_starts(path, [cut.start_s for cut in cuts])))
        source = ffmpeg.input(path)
        jobs = [(cuts, [_copy_output(source, cut, starts[cut.key], with_audio) for cut in cuts])]
    else:
        starts = {cut.key: cut.start_s for cut in cuts}
        by_start = sorted(cuts, key=lambda cut: cut.start_s)
        groups = [by_start[i:i + EXACT_CLIPS_PER_PROCESS] for i in range(0, len(by_start), EXACT_CLIPS_PER_PROCESS)]
        jobs = [(group, _exact_outputs(path, group, height, fps, codec, with_audio)) for group in groups]
    errors = {}
    for group, outputs in jobs:
        error = _run_ffmpeg(ffmpeg.merge_outputs(*outputs), timeout_s)
        errors |= {cut.key: error for cut in group}
    frame_s = 1 / ((fps if precision == "exact" else None) or info.fps or 25)
    return {cut.key: _keep_output(cut, min(cut.end_s, info.duration_s) - max(starts[cut.key], 0), frame_s,
                                  precision == "exact", errors[cut.key])
            for cut in cuts}


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
                   codec: str, with_audio: bool) -> list[ffmpeg.nodes.OutputStream]:
    # One decode feeds every clip: split the stream, trim each branch, restart its clock. The
    # input is entered (frame-accurately) at the first clip: time 0 of the graph is that start.
    origin = min(cut.start_s for cut in cuts)
    source = ffmpeg.input(path, ss=f"{origin:.6f}")
    videos = source["v:0"].split()
    audios = source["a:0"].asplit() if with_audio else None
    encoder = {"vcodec": codec, "pix_fmt": "yuv420p", "movflags": "+faststart"}
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
        streams = [video]
        if audios is not None:
            streams.append(audios[i].filter("atrim", start=start, end=end)
                           .filter("asetpts", "PTS-STARTPTS"))
        outputs.append(ffmpeg.output(*streams, _part_path(cut.out_path), **encoder))
    return outputs


def _run_ffmpeg(outputs: ffmpeg.nodes.OutputStream, timeout_s: float) -> str:
    """Run ffmpeg on ``outputs``; the last error line, or "" when it succeeded."""
    args = outputs.global_args("-nostdin", "-hide_banner", "-loglevel", "error").overwrite_output()
    try:
        result = subprocess.run(args.compile(), capture_output=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return f"ffmpeg took over {timeout_s:.0f}s"
    errors = result.stderr.decode(errors="replace").strip().splitlines()
    if result.returncode != 0:
        return errors[-1] if errors else f"ffmpeg exit {result.returncode}"
    return ""


def _duration(path: str) -> float:
    """What ffprobe calls the format duration, read in-process: an ffprobe per clip would take
    longer than cutting a clip."""
    try:
        with av.open(path) as container:
            return (container.duration or 0) / 1e6
    except (av.FFmpegError, OSError) as exc:
        raise BadInputError(f"unreadable output: {exc}") from None


def _keep_output(cut: ClipCut, want_s: float, frame_s: float, exact: bool,
                 ffmpeg_error: str) -> str | BadInputError:
    """Rename a whole output into place; a missing or wrongly long one is bad input."""
    part = _part_path(cut.out_path)
    try:
        got = _duration(part)
    except BadInputError as exc:
        problem = ffmpeg_error or str(exc)
    else:
        # Exact cuts last the request within a frame; copies may start up to a GOP early.
        short = got < want_s - frame_s - _EPS
        if not short and not (exact and got > want_s + frame_s + _EPS):
            os.replace(part, cut.out_path)
            return cut.out_path
        problem = f"output lasts {got:.3f}s, wanted {want_s:.3f}s" + (f" ({ffmpeg_error})" if ffmpeg_error else "")
    if os.path.exists(part):
        os.remove(part)
    return BadInputError(f"cutting {cut.start_s:.2f}-{cut.end_s:.2f}s failed: {problem}")
