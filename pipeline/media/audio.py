"""A media file's first audio track as the mono 16 kHz WAV that ASR backends read."""

from __future__ import annotations

import wave

import ffmpeg

from pipeline.errors import BadInputError
from pipeline.media.probe import probe
from pipeline.media.process import run_ffmpeg


def extract_audio(path: str, out_wav: str, sample_rate: int = 16000, timeout_s: float = 3600) -> float:
    """Write the first audio stream of ``path`` to ``out_wav`` as mono 16-bit PCM WAV at
    ``sample_rate`` Hz; returns the WAV's duration in seconds. A file without audio, or one
    ffmpeg cannot decode, is bad input."""
    info = probe(path)
    if not info.has_audio:
        raise BadInputError("no audio stream")
    stream = ffmpeg.input(path)["a:0"].output(out_wav, format="wav", acodec="pcm_s16le", ac=1,
                                              ar=sample_rate)
    run = run_ffmpeg(stream.get_args(), timeout_s)
    if run.failed:
        raise BadInputError(f"audio extraction failed: {run.reason}")
    try:
        with wave.open(out_wav, "rb") as wav:
            return wav.getnframes() / float(wav.getframerate())
    except (OSError, EOFError, wave.Error) as exc:
        raise BadInputError(f"audio extraction wrote an unreadable WAV: {exc}") from None
