"""Which device a stage runs on: the one place that answers "auto" and refuses a GPU that is
not there (silently running on the CPU would take days instead of hours)."""

from __future__ import annotations

import ctypes
import os

from pipeline.errors import SetupError


def cuda_devices() -> int:
    """CUDA devices visible to this process, counted through NVML, which does not initialise
    CUDA: a process that initialised it cannot hand CUDA to a process it forks, and the build's
    own process, which counts them, needs no CUDA of its own (its workers run the models).
    Without NVML (no NVIDIA driver) there is none. CUDA_VISIBLE_DEVICES narrows the count."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        count = ctypes.c_uint()
        found = count.value if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return found
    listed = [d.strip() for d in visible.split(",") if d.strip()]
    # CUDA stops at the first invalid entry; "-1" (or nothing) hides every device.
    return min(found, len(listed)) if listed and not listed[0].startswith("-") else 0


def pick_device(choice: str, setting: str) -> str:
    """``"cuda"`` or ``"cpu"`` for ``choice`` ("auto", "cpu", "cuda"); ``setting`` names where
    the choice came from (e.g. ``features.device``) in the error for a missing GPU."""
    if choice == "auto":
        return "cuda" if cuda_devices() else "cpu"
    if choice.startswith("cuda") and not cuda_devices():
        raise SetupError(f"{setting} is {choice!r} but no CUDA device is visible (NVML counts none)")
    return choice
