"""A media file's first audio track as the mono 16 kHz WAV that ASR backends read."""

from __future__ import annotations

import wave

import ffmpeg
import numpy as np

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


def read_wav(path: str, sample_rate: int = 16000) -> np.ndarray:
    """The samples of a mono 16-bit PCM WAV at ``sample_rate`` Hz, as ``extract_audio`` writes
    it, as float32 in [-1, 1) (what Whisper models take). Any other WAV is bad input."""
    try:
        with wave.open(path, "rb") as wav:
            got = (wav.getframerate(), wav.getnchannels(), wav.getsampwidth())
            if got != (sample_rate, 1, 2):
                raise BadInputError(f"expected mono 16-bit {sample_rate} Hz WAV, got {got[1]} channel(s), "
                                    f"{8 * got[2]}-bit, {got[0]} Hz")
            pcm = wav.readframes(wav.getnframes())
    except (OSError, EOFError, wave.Error) as exc:
        raise BadInputError(f"unreadable WAV: {exc}") from None
    return np.frombuffer(pcm, dtype="<i2").astype(np.float32) / 32768.0
