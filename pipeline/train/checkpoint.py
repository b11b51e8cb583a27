"""Reading a checkpoint: weights and plain values, never code.

A checkpoint is a pickle, and unpickling can call any function the file names; they sit under
the corpus root, which on a shared bucket anyone with write access to one object can change. So
every checkpoint is read with torch's weights-only unpickler, which builds tensors, containers
and numbers and refuses every other global. Beyond those, the trainer's checkpoints hold numpy's
random state (an array): the numpy names that rebuild an array are allowed, by name. A file
that names anything else is refused in one line, and nothing in it runs. Checkpoints of
earlier versions hold the same types, so they load as before.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pipeline.errors import SetupError

# numpy's random state in the trainer's checkpoints: an ndarray, rebuilt from these.
_ALLOWED: list[Any] = [np.ndarray, np.dtype, np.dtype(np.uint32).__class__]
try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
_ALLOWED.append(_reconstruct)


class UnsafeCheckpoint(SetupError):
    """A checkpoint that holds more than weights: refused unread. What needs it stops with this
    line (it is no item's fault); a training run resuming from it starts over instead."""


def load_checkpoint(source: str | Path | bytes, map_location: torch.device | str = "cpu",
                    name: str | None = None) -> dict[str, Any]:
    """The state a checkpoint file (or its bytes) holds; ``name`` says where it came from in
    the error (its path under the corpus root)."""
    where = name or str(source)
    handle = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with torch.serialization.safe_globals(_ALLOWED):
            return torch.load(handle, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise UnsafeCheckpoint(f"{where}: refused: it holds {_what(exc)}, which loading would run; vlcorpus "
                               f"writes checkpoints of weights only, so this file did not come from it: "
                               f"delete it (a build then trains again)") from None


def _what(exc: Exception) -> str:
    found = re.search(r"unsupported GLOBAL (\S+)", str(exc))
    return f"a call of {found.group(1)}" if found else "objects a checkpoint never holds"
