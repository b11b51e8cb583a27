"""Speech recognition: timed words from the audio of a media file.

Two backends share one small interface (`AsrBackend`): faster-whisper, local and the default,
and Google Cloud Speech-to-Text. Each is imported only when chosen, so neither package is
needed by a build that does not use it.

    backend = get_backend(cfg.transcribe.asr)      # loads the model / client once
    words = transcribe_media("video.mp4", backend)  # list[Word], times in seconds
    sentences = split_sentences(words, cfg.transcribe.sentences)
"""

from __future__ import annotations

import os
import tempfile
from typing import Protocol, runtime_checkable

from pipeline.config import AsrConfig
from pipeline.errors import SetupError
from pipeline.media import extract_audio
from pipeline.transcribe.segment import Word
from pipeline.setup import require_package

SAMPLE_RATE = 16000  # every backend gets mono 16-bit PCM at this rate


class AsrSetupError(SetupError):
    """The backend cannot run at all (a missing model, package or credentials); the message
    says what is missing and how to provide it."""


@runtime_checkable
class AsrBackend(Protocol):
    name: str  # "faster-whisper" or "google"; sentences get source "asr:<name>"

    def transcribe(self, wav_path: str) -> list[Word]:
        """Timed words of a mono 16-bit PCM WAV at 16 kHz, in time order."""


def get_backend(cfg: AsrConfig) -> AsrBackend:
    """The backend `cfg.backend` names, ready to use (its model or client is set up here, so a
    missing model fails before any item is processed)."""
    if cfg.backend == "faster-whisper":
        require_package("faster_whisper", "the faster-whisper ASR backend")
        from pipeline.transcribe.asr.whisper import WhisperBackend

        return WhisperBackend(cfg)
    if cfg.backend == "google":
        require_package("google.cloud.speech", "the google ASR backend")
        from pipeline.transcribe.asr.google import GoogleBackend

        return GoogleBackend(cfg)
    raise AsrSetupError(f"unknown ASR backend {cfg.backend!r}; known: faster-whisper, google")


def transcribe_media(path: str, backend: AsrBackend, workdir: str | None = None) -> list[Word]:
    """Timed words of the speech in a media file (any container ffmpeg reads). The audio is
    extracted to a temporary WAV under `workdir` (the system temp dir by default) and removed
    afterwards. A file without audio raises BadInputError."""
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vlc-asr-", dir=workdir) as tmp:
        wav = os.path.join(tmp, "audio.wav")
        duration = extract_audio(path, wav, sample_rate=SAMPLE_RATE)
        if duration <= 0:
            return []
        words = backend.transcribe(wav)
    return sorted(words, key=lambda w: (w.start_s, w.end_s))


__all__ = [
    "SAMPLE_RATE",
    "AsrBackend",
    "AsrSetupError",
    "get_backend",
    "transcribe_media",
]
