"""Which device a stage runs on: the one place that answers "auto" and refuses a GPU that is
not there (silently running on the CPU would take days instead of hours)."""

from __future__ import annotations

import importlib.util
import sys

from pipeline.errors import SetupError


def _cuda_devices() -> int:
    """CUDA devices visible to the library at hand: torch when it is installed (the features and
    trainer extras), else CTranslate2 (faster-whisper's engine, the asr extra)."""
    if importlib.util.find_spec("torch") is not None:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    # No torch (a core or asr install): ask faster-whisper's engine instead.
    try:
        import ctranslate2

        return ctranslate2.get_cuda_device_count()
    except Exception:  # noqa: BLE001 - not installed, or a broken CUDA install: no GPU for us
        return 0


def pick_device(choice: str, setting: str) -> str:
    """``"cuda"`` or ``"cpu"`` for ``choice`` ("auto", "cpu", "cuda"); ``setting`` names where
    the choice came from (e.g. ``features.device``) in the error for a missing GPU."""
    if choice == "auto":
        return "cuda" if _cuda_devices() else "cpu"
    if choice.startswith("cuda") and not _cuda_devices():
        raise SetupError(f"{setting} is {choice!r} but no CUDA device is visible "
                         f"({'torch' if 'torch' in sys.modules else 'CTranslate2'} sees none)")
    return choice
