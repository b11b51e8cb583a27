"""What a build needs besides its config, checked before it does any work: each stage declares
its check (``Stage.check``: binaries, packages, models, credentials), and a missing piece is
one ``SetupError`` line that says what to do, instead of tracebacks after hours of downloads."""

from __future__ import annotations

import importlib
import shutil
from collections.abc import Iterable

from pipeline.errors import SetupError

# Package -> the extra that brings it (pyproject.toml's optional dependencies); torch comes
# with both [features] and [train], and a caller that needs it for training says so.
EXTRAS = {
    "torch": "features", "torchvision": "features", "transformers": "features",
    "faster_whisper": "asr", "google.cloud.speech": "gcp", "webdataset": "train",
}


def require_binaries(*names: str) -> None:
    missing = [name for name in names if shutil.which(name) is None]
    if missing:
        raise SetupError(f"{', '.join(missing)} not found on PATH: apt-get install -y ffmpeg "
                         f"(or your system's package)")


def require_package(module: str, what: str, extra: str | None = None) -> None:
    """``module`` importable, else a SetupError naming the pip command of its extra."""
    try:
        importlib.import_module(module)
    except ImportError:
        extra = extra or EXTRAS.get(module)
        how = f"pip install 'vlcorpus[{extra}]'" if extra else f"pip install {module}"
        raise SetupError(f"{what} needs the {module} package: {how}") from None


def check_stages(cfg: object, parts: Iterable[object]) -> None:
    """Run the checks the stage parts declare, in order; the first problem stops the build."""
    for part in parts:
        check = getattr(part, "check", None)
        if check is not None:
            check(cfg)
