"""The training loop on synthetic pairs whose visual and text features share latent factors."""

import json

import numpy as np
import pytest

from pipeline.config import TrainConfig
from pipeline.train.data import PairSet
from pipeline.train.loop import evaluate, latest_checkpoint, train


def synth_pairs(n=200, groups=40, seed=0, dv=32, dt=24, latent=8) -> PairSet:
    """n pairs in `groups` videos; the last quarter of the videos is the test split (50 pairs,
    random R@1 = 2%). Frames [T, dv] and words [K, dt] are noisy views of one latent z."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(latent, dv)), rng.normal(size=(latent, dt))
    ids, gs, splits, vis, txt, cands = [], [], [], [], [], []
    for i in range(n):
        g = i % groups
        z = rng.normal(size=latent)
        vis.append((z @ a)[None] + 0.5 * rng.normal(size=(rng.integers(2, 8), dv)))
        txt.append((z @ b)[None] + 0.5 * rng.normal(size=(rng.integers(3, 15), dt)))
        ids.append(f"p{i}")
        gs.append(f"g{g}")
        splits.append("test" if g >= groups * 3 // 4 else "train")
        cands.append([])
    return PairSet(ids, gs, splits, vis, txt, cands)


PAIRS = synth_pairs()
FAST = {
    "wal": dict(lr=0.1, options={"freeze_epochs": 2, "n_frames": 3}),
    "nce": {}, "mms": {}, "amm": {}, "shn": {},
    "milnce": dict(options={"text_hidden": 128}),
    "max_margin": {}, "order": {}, "asynce": dict(lr=0.05),
}


def cfg(model, epochs=5, **extra):
    return TrainConfig(model=model, visual="v", text="t", embed_dim=64, batch_size=32, epochs=epochs,
                       **{**FAST[model], **extra})


@pytest.mark.parametrize("model", list(FAST))
def test_each_family_beats_random(model, tmp_path):
    result = train(PAIRS, cfg(model), tmp_path, device="cpu")
    assert result["n_test"] == 50 and result["protocol"] == "fixed_50"
    assert result["t2v"]["R@1"] >= 16.0 and result["v2t"]["R@1"] >= 16.0, result  # random: 2%
    assert result["mc_acc"] > 40.0  # random: 20%
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert {"t2v", "v2t", "mc_acc", "curve"} <= set(written)
    assert [p["epoch"] for p in written["curve"]] == list(range(5))
    assert (tmp_path / "curve.png").stat().st_size > 0
    if model == "wal":
        assert all(0.0 <= p["z0_share"] <= 1.0 for p in written["curve"])
    else:
        assert "z0_share" not in written["curve"][0]


def test_resume_continues_at_next_epoch_with_same_result(tmp_path):
    full = train(PAIRS, cfg("wal", epochs=4), tmp_path / "full", device="cpu")
    part = tmp_path / "part"
    train(PAIRS, cfg("wal", epochs=2), part, device="cpu")
    assert latest_checkpoint(part).name == "epoch_0001.pt"
    resumed = train(PAIRS, cfg("wal", epochs=4), part, device="cpu")
    assert [p["epoch"] for p in resumed["curve"]] == [0, 1, 2, 3]
    for a, b in zip(full["curve"], resumed["curve"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert a["z0_share"] == b["z0_share"]
    assert resumed["t2v"] == pytest.approx(full["t2v"])
    # nothing left to do: a second resume trains no epoch and reports the same metrics
    again = train(PAIRS, cfg("wal", epochs=4), part, device="cpu")
    assert again["t2v"] == pytest.approx(full["t2v"])


def test_evaluate_from_checkpoint(tmp_path):
    result = train(PAIRS, cfg("nce", epochs=2), tmp_path, device="cpu")
    again = evaluate(tmp_path, PAIRS, device="cpu")
    assert again["epoch"] == 1
    assert again["t2v"] == pytest.approx(result["t2v"])
    with pytest.raises(FileNotFoundError):
        evaluate(tmp_path / "nothing", PAIRS)
