"""Media inspection with ffprobe/ffmpeg (ffmpeg-python): what a file holds, and whether it is whole."""

from __future__ import annotations

import subprocess
import wave
from dataclasses import dataclass
from fractions import Fraction

import ffmpeg

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


def check_video(path: str, timeout_s: float = 120.0) -> MediaInfo:
    """A video stream, a positive duration, and an end that decodes (catches cut files)."""
    info = probe(path)
    if not info.has_video:
        raise BadInputError("no video stream")
    if info.duration_s <= 0:
        raise BadInputError("duration is 0")
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
