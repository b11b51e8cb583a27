"""What a build needs besides its config, checked before it does any work: each stage declares
its check (``Stage.check``: binaries, packages, models, credentials), and a missing piece is
one ``SetupError`` line that says what to do, instead of tracebacks after hours of downloads.
A check downloads no model: one that a build would download on first use passes, with a note
(pipeline/models/cache.py)."""

from __future__ import annotations

import importlib
import os
import shutil
from collections.abc import Iterable
from typing import TYPE_CHECKING

from pipeline.errors import SetupError
from pipeline.models.cache import DownloadOnFirstUse, setup_check

if TYPE_CHECKING:
    from pipeline.corpus.storage import Corpus

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


def check_stages(cfg: object, parts: Iterable[object]) -> list[str]:
    """Run the checks the stage parts declare, in order; the first problem stops the build.
    Returns the notes of the models a build will download on first use."""
    notes = []
    with setup_check():
        for part in parts:
            check = getattr(part, "check", None)
            if check is None:
                continue
            try:
                check(cfg)
            except DownloadOnFirstUse as note:
                notes.append(str(note))
    return notes


def stage_problems(cfg: object, parts: Iterable[object]) -> tuple[list[str], list[str]]:
    """What ``check_stages`` would stop at, and every problem after it: one line each, the
    build's own, once (two extractors missing the same package say it once); and its notes."""
    problems: list[str] = []
    notes: list[str] = []
    for part in parts:
        try:
            notes += check_stages(cfg, [part])
        except SetupError as exc:
            if str(exc) not in problems:
                problems.append(str(exc))
    return problems, notes


def root_problem(corpus: Corpus) -> str | None:
    """Why a build could not write its corpus, found without writing: a local root exists as a
    folder or can be created (its nearest existing parent is a writable folder); on an object
    store the root's bucket can be listed (credentials, endpoint, the bucket itself)."""
    if corpus.is_local:
        return _local_root_problem(corpus.url, corpus.root)
    try:
        if corpus.fs.root_marker == "":  # an object store: roots live in buckets
            corpus.fs.ls(corpus.root.strip("/").split("/", 1)[0])
        else:
            corpus.fs.exists(corpus.root)
    except Exception as exc:  # noqa: BLE001 - missing bucket, credentials, endpoint: all unreachable
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"corpus root {corpus.url} is not reachable: {type(exc).__name__}: {first}"
    return None


def _local_root_problem(url: str, path: str) -> str | None:
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"corpus root {url} cannot be created: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"corpus root {url} cannot be written: {existing} is not writable by this user"
    return None
