"""No checkpoint can run code: one crafted to run a command when unpickled, planted in a corpus
root, is refused in one line naming the file by `vlcorpus eval`, by the score stage and by a
training run resuming from it (which starts over), and the command never runs; the checkpoints
the trainer writes load as before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import trainkit
from conftest import vlcorpus
from pipeline.corpus.storage import Corpus
from pipeline.train.checkpoint import UnsafeCheckpoint, load_checkpoint


class _Payload:
    """Unpickled, it runs a command: what an attacker who can write one object would plant."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _config(tmp_path: Path, root: Path) -> Path:
    config = tmp_path / "c.yaml"
    config.write_text(f"name: syn\nroot: {root}\nsources:\n  - type: urls\n    urls: [http://127.0.0.1/x]\n"
                      "features:\n  extractors:\n    - {name: resnet34, weights: none}\n    - {name: 'text:x'}\n"
                      "train: {model: nce, visual: resnet34, text: 'text:x', epochs: 2, batch_size: 16,\n"
                      "        embed_dim: 8, finetune: false}\n")
    return config


@pytest.fixture
def trained(tmp_path):
    root = tmp_path / "root"
    trainkit.synthetic_features(Corpus(str(root)), n=40)
    config = _config(tmp_path, root)
    done = vlcorpus("train", str(config), "--device", "cpu")
    assert done.returncode == 0, done.stderr[-3000:]
    (root / "config.yaml").write_text(config.read_text())  # as a build leaves it: `vlcorpus eval ROOT` reads it
    return root, config


def _plant(path: Path, marker: Path) -> None:
    state = torch.load(path, weights_only=False) if path.exists() else {}
    torch.save({**state, "config": _Payload(marker)}, path)


@pytest.mark.slow
def test_a_planted_checkpoint_is_refused_and_runs_nothing(trained, tmp_path):
    root, config = trained
    checkpoints = root / "train" / "nce" / "checkpoints"
    # What the trainer wrote loads with the weights-only reader (numpy's random state included).
    state = load_checkpoint(sorted(checkpoints.glob("epoch_*.pt"))[-1])
    assert state["epoch"] == 1 and "numpy" in state["rng"]

    marker = tmp_path / "pwned"
    planted = checkpoints / "epoch_0020.pt"
    _plant(planted, marker)
    evaluated = vlcorpus("eval", str(root), "--device", "cpu")
    assert evaluated.returncode == 2
    lines = evaluated.stderr.strip().splitlines()
    assert len(lines) == 1 and str(planted) in lines[0], evaluated.stderr
    assert "refused" in lines[0] and "posix.system" in lines[0]
    assert not marker.exists()

    # The score stage stops with the same line, unread.
    from pipeline.config import load_config
    from pipeline.score.stage import load_scorer

    cfg = load_config(config).model_copy(update={"score": None})
    scored = cfg.model_validate({**cfg.model_dump(mode="json"), "score": {"device": "cpu"}})
    with pytest.raises(UnsafeCheckpoint, match=r"train/nce/checkpoints/epoch_0020.pt#\w+: refused"):
        load_scorer(Corpus(str(root)), scored)
    assert not marker.exists()

    # A training run resuming from it starts over, and the planted file is replaced.
    again = vlcorpus("train", str(config), "--device", "cpu")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "training starts over" in again.stderr
    assert not planted.exists()
    assert not marker.exists()
