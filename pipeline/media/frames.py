"""The frames each clip needs, from one decode per video (PyAV)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import av
import numpy as np
from av.video.reformatter import VideoReformatter

from pipeline.errors import BadInputError

END_SLACK_S = 0.5  # a time this far past the last frame still takes the last frame
SEEK_MIN_S = 1.0  # seek only past this much video: a seek flushes the frames being decoded
TIME_EPS = 1e-6  # float slack when comparing sample times with frame times
F = TypeVar("F")  # a decoder's frame


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


def _centre_crop(image: Any, crop: int | None) -> Any:
    if crop is None:
        return image
    top, left = (image.shape[0] - crop) // 2, (image.shape[1] - crop) // 2
    return image[top:top + crop, left:left + crop]


class Images(Protocol[F]):
    """How one decoder's frames become the images requests get: uint8 [H, W, 3] RGB arrays (or
    tensors) that slice like numpy's."""

    def size(self, frame: F) -> tuple[int, int]:
        """Width and height as decoded."""

    def resize(self, frame: F, size: tuple[int, int]) -> Any:
        """The frame in RGB at ``size`` (width, height)."""

    def upright(self, image: Any, frame: F) -> Any:
        """``image`` turned as the frame's display rotation says."""

    def stack(self, images: list[Any]) -> Any:
        """[T, H, W, 3] of the images."""


class _PyAVImages:
    """Images of PyAV frames, converted by swscale. One reformatter per output size keeps its
    swscale context: building one per frame (what ``VideoFrame.reformat`` does) cost twice the
    conversion itself."""

    def __init__(self) -> None:
        self.reformatters: dict[tuple[int, int], VideoReformatter] = {}

    def size(self, frame: av.VideoFrame) -> tuple[int, int]:
        return frame.width, frame.height

    def resize(self, frame: av.VideoFrame, size: tuple[int, int]) -> np.ndarray:
        # Planar RGB (gbrp), interleaved by numpy: the same pixels as swscale's rgb24 output in
        # half the time (its scaled packed-RGB path is slow). One swscale thread: the decoder's
        # threads (or the other decode processes) have the cores.
        reformatter = self.reformatters.setdefault(size, VideoReformatter())
        return reformatter.reformat(frame, width=size[0], height=size[1], format="gbrp",
                                    threads=1).to_ndarray()

    def upright(self, image: np.ndarray, frame: av.VideoFrame) -> np.ndarray:
        return np.rot90(image, k=round(frame.rotation / 90))

    def stack(self, images: list[np.ndarray]) -> np.ndarray:
        return np.stack(images)


@dataclass
class _Shown(Generic[F]):
    """A decoded frame and its images so far, by output size."""

    time_s: float
    frame: F
    resized: dict[tuple[int, int], Any] = field(default_factory=dict)


class Collector(Generic[F]):
    """The frames of all requests of one video, fed with its decoded frames in display order.
    Sample times of every request are merged into one sorted list, so each decoded frame costs
    one comparison; a frame is converted only when some time falls on it, once per output size
    however many requests share it. Conversions run in the decoding thread: a second thread for
    them measured no faster. Each time takes the frame shown then (the last at or before it),
    or with ``nearest`` the frame nearest to it (the earlier of two as near): for a decoder
    that leaves frames out (``skip_nonref``)."""

    def __init__(self, requests: Sequence[FrameRequest], images: Images[F], nearest: bool = False) -> None:
        keys = [r.key for r in requests]
        if len(set(keys)) != len(keys):
            raise ValueError("request keys must be unique")
        self.images = images
        times = {r.key: frame_times(r) for r in requests}
        self.requests = {r.key: r for r in requests}
        self.wanted = {key: len(t) for key, t in times.items()}
        # Per open request: its frames so far, resized, cropped and turned upright.
        self.frames: dict[str, list[Any]] = {r.key: [] for r in requests}
        # Decode order: by time, then by clip start, so earlier clips complete first.
        by_start = sorted(requests, key=lambda r: (r.start_s, r.end_s))
        self.events = sorted((t, i, r.key) for i, r in enumerate(by_start) for t in times[r.key])
        self.pos = 0
        self.last: _Shown[F] | None = None  # the newest frame, shown until the next
        self.nearest = nearest

    def next_time(self) -> float | None:
        """The earliest sample time not yet served."""
        return self.events[self.pos][0] if self.pos < len(self.events) else None

    def add(self, time_s: float, frame: F) -> Iterator[tuple[str, Any]]:
        """A new frame shown from ``time_s``: times before it fall on the previous frame (or on
        this one, when it is the first)."""
        if self.last is None:  # the first frame also shows before its time
            self.last = _Shown(time_s, frame)
        if self.nearest:  # the previous frame up to half way, this one after
            yield from self._serve(self.last, until=(self.last.time_s + time_s) / 2 + TIME_EPS)
            if self.last.frame is not frame:
                self.last = _Shown(time_s, frame)
        yield from self._serve(self.last, until=time_s - TIME_EPS)
        if self.last.frame is not frame:
            self.last = _Shown(time_s, frame)

    def finish(self) -> Iterator[tuple[str, Any]]:
        """The media ended: times shortly after the last frame take it, the rest fail."""
        if self.last is not None:
            yield from self._serve(self.last, until=self.last.time_s + END_SLACK_S)
        end = f"{self.last.time_s:.2f}s" if self.last else "its start (no frames decoded)"
        yield from self.fail(f"media ends at {end}, before the requested frames")

    def fail(self, message: str) -> Iterator[tuple[str, BadInputError]]:
        """Every request still open fails with ``message``."""
        for key, request in self.requests.items():
            del self.frames[key]
            yield key, BadInputError(f"{message} (wanted {request.start_s:.2f}-{request.end_s:.2f}s)")
        self.requests.clear()

    def _serve(self, shown: _Shown[F], until: float) -> Iterator[tuple[str, Any]]:
        """``shown`` for every sample time before ``until``; requests complete as they fill."""
        width, height = self.images.size(shown.frame)
        while self.pos < len(self.events) and self.events[self.pos][0] < until:
            key = self.events[self.pos][2]
            self.pos += 1
            if key not in self.frames:  # already failed
                continue
            request = self.requests[key]
            size = _resized_size(width, height, request.spec.short_side)
            if size not in shown.resized:
                shown.resized[size] = self.images.resize(shown.frame, size)
            image = _centre_crop(shown.resized[size], request.spec.crop)
            self.frames[key].append(self.images.upright(image, shown.frame))
            if len(self.frames[key]) == self.wanted[key]:
                del self.requests[key]
                yield key, self.images.stack(self.frames.pop(key))


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


def sample_frames(path: str, requests: Sequence[FrameRequest], threads: int = 0,
                  skip_nonref: bool = False) -> Iterator[tuple[str, np.ndarray | BadInputError]]:
    """Decode ``path`` once and yield ``(key, uint8 [T, H, W, 3] RGB)`` for each request as soon
    as its frames are in, or ``(key, BadInputError)`` when the file is unreadable, decoding fails,
    or the media ends before the request's times. Each time takes the frame shown then (the last
    with pts <= t). Only frames of requests still open are held. ``threads``: decoder threads
    (0: FFmpeg's choice). ``skip_nonref``: the decoder skips the frames no other frame refers
    to (FFmpeg's skip_frame nonref; most B-frames: 1.3-1.6x the decoding speed on x264's B-frame
    presets), and each time takes the decoded frame nearest to it: at most half the longest run
    of skipped frames away (one frame with x264's defaults, 3 B-frames in a pyramid)."""
    collector: Collector[av.VideoFrame] = Collector(requests, _PyAVImages(), nearest=skip_nonref)
    if not requests:
        return
    try:
        container = av.open(path)
    except (av.FFmpegError, OSError) as exc:
        yield from collector.fail(f"unreadable media: {exc}")
        return
    with container:
        yield from _sample(container, collector, threads, skip_nonref)


def _sample(container: av.container.InputContainer, collector: Collector[av.VideoFrame],
            threads: int, skip_nonref: bool) -> Iterator[tuple[str, np.ndarray | BadInputError]]:
    """Decode the first video stream of an open container into ``collector``."""
    if not container.streams.video:
        yield from collector.fail("no video stream")
        return
    stream = container.streams.video[0]
    stream.thread_type = "AUTO"
    stream.codec_context.thread_count = threads
    if skip_nonref:
        stream.codec_context.skip_frame = "NONREF"
    try:
        for time_s, frame in _decoded(container, stream, collector.next_time):
            yield from collector.add(time_s, frame)
        yield from collector.finish()
    except av.FFmpegError as exc:
        yield from collector.fail(f"decoding failed: {exc}")
