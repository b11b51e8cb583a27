"""What a media file holds (streams, size, rate, duration) and whether it is whole."""

from __future__ import annotations

from dataclasses import dataclass, replace
from fractions import Fraction

import av

from pipeline.errors import BadInputError
from pipeline.media.process import run_ffmpeg


@dataclass(frozen=True)
class MediaInfo:
    duration_s: float
    has_video: bool
    has_audio: bool
    width: int | None = None
    height: int | None = None
    fps: float | None = None
    audio_codec: str | None = None  # the first audio stream's, as FFmpeg names it ("aac")


def _rate(rate: Fraction | None) -> float | None:
    try:
        return float(rate) or None if rate else None
    except ZeroDivisionError:
        return None


def probe(path: str) -> MediaInfo:
    """Streams and duration of a media file, read in-process from its header (PyAV, what ffprobe
    shows); unreadable files are bad input."""
    try:
        # Everything is read while the container is open: PyAV 19 refuses a stream's codec
        # context and rates once its container has closed.
        with av.open(path) as container:
            video = next((s for s in container.streams.video
                          if not s.disposition & av.stream.Disposition.attached_pic), None)
            audio = container.streams.audio[0] if container.streams.audio else None
            duration = (container.duration or 0) / 1e6
            return MediaInfo(
                duration_s=duration if duration == duration else 0.0,  # NaN counts as unknown
                has_video=video is not None,
                has_audio=audio is not None,
                width=video.codec_context.width or None if video else None,
                height=video.codec_context.height or None if video else None,
                fps=_rate(video.average_rate or video.guessed_rate) if video else None,
                audio_codec=audio.codec_context.name if audio else None,
            )
    except (av.FFmpegError, OSError) as exc:
        # The reason without the path: messages never carry local paths.
        raise BadInputError(f"unreadable media: {getattr(exc, 'strerror', None) or exc}") from None


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
    # Decode the last second: a file cut short after its index still probes fine. Any error
    # output counts, even when ffmpeg exits 0.
    run = run_ffmpeg(["-sseof", "-1", "-i", path, "-map", "0:v:0", "-f", "null", "-"], timeout_s)
    if run.timed_out:
        raise BadInputError(f"decoding the end of the file took over {timeout_s:.0f}s")
    if run.returncode != 0 or run.errors:
        first = run.errors[0] if run.errors else f"ffmpeg exit {run.returncode}"
        raise BadInputError(f"truncated or corrupt media: {first}")
    end = video_end(path)
    if end is None:
        raise BadInputError("the video stream has no frames")
    if end <= 0:
        raise BadInputError("duration is 0")
    if not 0 < info.duration_s <= end + DURATION_SLACK_S:
        return replace(info, duration_s=end)
    return info
