"""Relative paths in a config file mean paths beside it: a config read from any working
directory (the CLI's, a Prefect worker's) names the same files and the same root."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.config.model import Config
from pipeline.config.score import MILNCE_PREFIX

# Extractor weights that name no file.
_WEIGHT_WORDS = ("default", "none")


def _relative(value: str) -> bool:
    """A local path that is neither absolute, nor home-based, nor an fsspec URL."""
    return "://" not in value and not os.path.isabs(value) and not value.startswith("~")


def _beside(folder: Path, value: str | None, *, only_if_there: bool = False) -> str | None:
    """``value`` resolved against ``folder`` when relative; a value that may also be a name (a
    model name) only when that file or folder exists there."""
    if value is None or not _relative(value):
        return value
    candidate = Path(os.path.normpath(folder / value))
    if only_if_there and not candidate.exists():
        return value
    return str(candidate)


def rebase(cfg: Config, folder: Path) -> Config:
    """A copy of ``cfg`` whose relative paths are resolved against ``folder``: the root, list
    and folder sources, cookies, held-out clip ids, extractor weights, the MIL-NCE checkpoint
    a local ASR model, and a SLURM cluster's Python, job logs and certificates."""
    folder = folder.resolve()
    out = cfg.model_copy(deep=True)
    out.root = _beside(folder, out.root)
    for source in out.sources:
        if source.type in ("list", "folder"):
            source.path = _beside(folder, source.path)
    out.download.cookies_file = _beside(folder, out.download.cookies_file)
    out.align.test_clip_ids = _beside(folder, out.align.test_clip_ids)
    for extractor in out.features.extractors:
        if extractor.weights not in _WEIGHT_WORDS and not extractor.weights.startswith("package:"):
            extractor.weights = _beside(folder, extractor.weights)
    if out.score is not None and out.score.model and out.score.model.startswith(MILNCE_PREFIX):
        out.score.model = MILNCE_PREFIX + _beside(folder, out.score.model[len(MILNCE_PREFIX):])
    out.transcribe.asr.model = _beside(folder, out.transcribe.asr.model, only_if_there=True)
    cluster = out.execution.cluster
    if cluster.kind == "slurm":
        # A bare "python3" is a command on the PATH, not a file beside the config.
        cluster.python = _beside(folder, cluster.python) if cluster.python and "/" in cluster.python \
            else cluster.python
        cluster.log_dir = _beside(folder, cluster.log_dir)
        cluster.tls = _beside(folder, cluster.tls)
    return out
