"""The training loop on synthetic pairs whose visual and text features share latent factors."""

import json

import numpy as np
import pytest
import torch

import trainkit
from pipeline.config import TrainConfig
from pipeline.train.loop import evaluate, latest_checkpoint, train
from pipeline.train.pairs import PairSet, PairsError
from pipeline.train.schedule import LrSchedule, schedule_for


def synth_pairs(n=200, groups=40, seed=0, dv=32, dt=24, latent=8, val_groups=0) -> PairSet:
    """n pairs in `groups` videos; the last quarter of the videos is the test split (50 pairs,
    random R@1 = 2%), the `val_groups` before it the val split. Frames [T, dv] and words
    [K, dt] are noisy views of one latent z."""
    rng = np.random.default_rng(seed)
    a, b = rng.normal(size=(latent, dv)), rng.normal(size=(latent, dt))
    ids, gs, splits, vis, txt, cands = [], [], [], [], [], []
    first_test = groups * 3 // 4
    for i in range(n):
        g = i % groups
        z = rng.normal(size=latent)
        vis.append((z @ a)[None] + 0.5 * rng.normal(size=(rng.integers(2, 8), dv)))
        txt.append((z @ b)[None] + 0.5 * rng.normal(size=(rng.integers(3, 15), dt)))
        ids.append(f"p{i}")
        gs.append(f"g{g}")
        splits.append("test" if g >= first_test else "val" if g >= first_test - val_groups else "train")
        cands.append([])
    return PairSet(ids, gs, splits, vis, txt, cands)


@pytest.fixture(autouse=True)
def one_torch_thread():
    """The models here are tiny: one thread runs them fastest and leaves the other core to the
    rest of the suite (CPU results match at equal thread counts)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


PAIRS = synth_pairs()
SMIT_FAST = {"finetune": False, "select": "last"}
FAST = {
    "wal": dict(lr=0.1, options={"freeze_epochs": 2, "n_frames": 3}),
    "nce": SMIT_FAST, "mms": SMIT_FAST, "amm": SMIT_FAST, "shn": SMIT_FAST,
    "milnce": dict(warmup_steps=0, options={"text_hidden": 128}),
    "max_margin": {}, "order": dict(options={"variant": "m1"}), "asynce": dict(lr=0.05),
}


def cfg(model, epochs=5, **extra):
    return TrainConfig(model=model, visual="v", text="t", **{"embed_dim": 64, "batch_size": 32, "epochs": epochs,
                                                            **FAST[model], **extra})


@pytest.mark.parametrize("model", list(FAST))
def test_each_family_beats_random(model, tmp_path):
    result = train(PAIRS, cfg(model), tmp_path, device="cpu")
    assert result["n_test"] == 50 and result["protocol"] == "fixed_50" and result["split"] == "test"
    assert result["t2v"]["R@1"] >= 16.0 and result["v2t"]["R@1"] >= 16.0, result  # random: 2%
    assert result["mc_acc"] > 40.0 and result["mc_rule"] == "other_videos"  # random: 20%
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert {"t2v", "v2t", "mc_acc", "curve", "selected"} <= set(written)
    # What it trained on, for the report: the config and the pairs per split.
    assert written["config"]["model"] == model and written["config"]["visual"] == "v"
    assert written["data"]["pairs"] == {"test": 50, "train": 150}
    assert (written["data"]["visual_dim"], written["data"]["text_dim"]) == (32, 24)
    assert [p["epoch"] for p in written["curve"]] == list(range(5))
    assert written["selected"]["by"] == "last" and written["selected"]["epoch"] == 4
    assert (tmp_path / "curve.png").stat().st_size > 0
    if model == "wal":  # the discriminator is frozen for 2 epochs: no z drawn, then a share
        assert [p["z0_share"] is None for p in written["curve"]] == [True, True, False, False, False]
        assert all(0.0 <= p["z0_share"] <= 1.0 for p in written["curve"][2:])
    else:
        assert "z0_share" not in written["curve"][0]


VARIANTS = {
    "milnce attn": ("milnce", dict(warmup_steps=0, options={"text_hidden": 128, "variant": "attn"})),
    "milnce cat": ("milnce", dict(warmup_steps=0, options={"text_hidden": 128, "variant": "cat"})),
    "milnce max": ("milnce", dict(warmup_steps=0, options={"text_hidden": 128, "variant": "max"})),
    "order m2": ("order", dict(epochs=12, lr=3e-3, options={"variant": "m2"})),
    "order m3": ("order", dict(epochs=12, lr=3e-3, options={"variant": "m3", "att_dim": 32})),
    "asynce cmt": ("asynce", dict(lr=0.05, embed_dim=32, options={"cmt": True, "cmt_ffn": 32})),
    "asynce nce": ("asynce", dict(lr=0.05, options={"loss": "nce", "entity": "mean", "frame": "mean"})),
}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_variants_beat_random(name, tmp_path):
    """Torabi's M2 (LSTM) and M3 (LSTM + frame attention), MIL-NCE's baselines and AsyNCE with
    its cross-modal transformer train on the synthetic pairs (random R@1: 2%; with one clip's
    candidates empty the MIL-NCE bags hold the own narration only)."""
    model, extra = VARIANTS[name]
    result = train(PAIRS, cfg(model, **extra), tmp_path, device="cpu")
    assert result["t2v"]["R@1"] >= 12.0 and result["v2t"]["R@1"] >= 12.0, result


def test_frozen_discriminator_trains_as_wal_att(tmp_path):
    """WAL 5.3: while the discriminator is fixed the model is WAL-att: the same losses, the same
    weights, and the discriminator itself untouched; then it trains and draws z."""
    adv = cfg("wal", epochs=3, options={"freeze_epochs": 2, "n_frames": 3})
    plain = cfg("wal", epochs=2, options={"adversarial": False, "n_frames": 3})
    with_adv = train(PAIRS, adv, tmp_path / "adv", device="cpu")
    without = train(PAIRS, plain, tmp_path / "plain", device="cpu")
    assert [p["loss"] for p in with_adv["curve"][:2]] == [p["loss"] for p in without["curve"]]
    states = [torch.load(tmp_path / "adv" / "checkpoints" / f"epoch_{e:04d}.pt", weights_only=False)["model"]
              for e in (0, 1, 2)]
    frozen_plain = torch.load(tmp_path / "plain" / "checkpoints" / "epoch_0001.pt", weights_only=False)["model"]
    for key, value in frozen_plain.items():
        assert torch.equal(states[1][key], value), key
    for key in ("discriminator.background", "discriminator.f_adv.weight", "discriminator.f_adv.bias"):
        assert torch.equal(states[0][key], states[1][key])  # fixed while frozen
        assert not torch.equal(states[1][key], states[2][key])  # trained after
    assert with_adv["curve"][2]["z0_share"] is not None


def test_lr_schedule_by_hand():
    s = LrSchedule(1e-3, milestones=(60, 80), gamma=0.1, warmup_steps=5000)
    assert s(0, 0) == pytest.approx(1e-3 / 5000)
    assert s(2499, 0) == pytest.approx(0.5e-3)
    assert s(4999, 0) == s(10**6, 59) == pytest.approx(1e-3)
    assert s(10**6, 60) == pytest.approx(1e-4) and s(10**6, 80) == pytest.approx(1e-5)
    # WAL's paper settings: the discriminator unfreezes at 50 with the full lr; ÷10 at 60.
    wal = schedule_for(TrainConfig(model="wal", visual="v", text="t"))
    assert wal(0, 50) == pytest.approx(0.1) and wal(0, 59) == pytest.approx(0.1) and wal(0, 60) == pytest.approx(0.01)
    stepped = schedule_for(TrainConfig(model="wal", visual="v", text="t", lr_step=15, epochs=40))
    assert [stepped(0, e) for e in (14, 15, 30)] == pytest.approx([0.1, 0.01, 0.001])
    with pytest.raises(ValueError, match="lr_step or lr_milestones"):
        TrainConfig(model="wal", visual="v", text="t", lr_step=15, lr_milestones=[3])


def test_curve_records_the_lr_of_each_epoch(tmp_path):
    result = train(PAIRS, cfg("wal", epochs=4, lr_milestones=[3], options={"freeze_epochs": 2, "n_frames": 3}),
                   tmp_path, device="cpu")
    assert [p["lr"] for p in result["curve"]] == pytest.approx([0.1, 0.1, 0.1, 0.01])


def test_no_test_split_is_an_error_unless_eval_on_all(tmp_path):
    pairs = PairSet(PAIRS.pair_ids, PAIRS.groups, ["train"] * len(PAIRS), PAIRS.visual, PAIRS.text)
    with pytest.raises(PairsError, match="no pair is in the test split.*--eval-on all"):
        train(pairs, cfg("nce", epochs=1), tmp_path / "a", device="cpu")
    assert latest_checkpoint(tmp_path / "a") is None  # refused before training
    result = train(pairs, cfg("nce", epochs=1), tmp_path / "b", device="cpu", eval_on="all")
    assert result["split"] == "all" and result["n_test"] == len(pairs)
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["split"] == "all"
    with pytest.raises(PairsError, match="no pair is in the test split"):
        evaluate(tmp_path / "b", pairs, device="cpu")


def test_val_selection_keeps_the_best_epoch(tmp_path):
    pairs = synth_pairs(val_groups=6)
    config = cfg("order", epochs=4, select="val_loss")
    result = train(pairs, config, tmp_path, device="cpu")
    vals = [p["val"] for p in result["curve"]]
    best = int(np.argmax(vals))
    assert result["selected"] == {"by": "val_loss", "epoch": best, "value": vals[best]}
    again = evaluate(tmp_path, pairs, device="cpu")  # evaluates best.pt, not the newest epoch
    assert again["epoch"] == best and again["checkpoint"].endswith("best.pt")
    assert again["t2v"] == pytest.approx(result["t2v"])
    recall = train(pairs, cfg("nce", epochs=3, select="val_recall"), tmp_path / "r", device="cpu")
    assert [p["epoch"] for p in recall["curve"]] == [0, 1, 2]
    assert recall["selected"]["by"] == "val_recall" and all(0 <= p["val"] <= 100 for p in recall["curve"])
    no_val = train(PAIRS, cfg("nce", epochs=1, select="val_recall"), tmp_path / "n", device="cpu")
    assert no_val["selected"]["by"] == "last" and "no val split" in no_val["selected"]["note"]


def test_smit_second_phase_starts_from_the_selected_checkpoint(tmp_path):
    pairs = synth_pairs(val_groups=6)
    result = train(pairs, cfg("amm", epochs=3, select="val_recall", finetune=True, finetune_lr=1e-4),
                   tmp_path, device="cpu")
    curve = result["curve"]
    assert [p["lr"] for p in curve] == pytest.approx([1e-3] * 3 + [1e-4] * 3)
    first_best = int(np.argmax([p["val"] for p in curve[:3]]))

    def weights(epoch):
        return torch.load(tmp_path / "checkpoints" / f"epoch_{epoch:04d}.pt", weights_only=False)["model"]

    def distance(a, b):
        return max(float((a[k].float() - b[k].float()).abs().max()) for k in a if a[k].is_floating_point())

    # Epoch 3 starts from the selected epoch with a fresh Adam at 1e-4: a handful of steps of
    # at most ~lr each (Adam's step bound) away from it, far from the other phase-1 epochs.
    steps = 4  # 120 train pairs in batches of 32 (the last one short)
    assert distance(weights(3), weights(first_best)) < 2 * steps * 1e-4
    assert all(distance(weights(3), weights(e)) > 2 * steps * 1e-4 for e in range(3) if e != first_best)
    assert result["selected"]["epoch"] in range(6)


def test_resume_continues_at_next_epoch_with_same_result(tmp_path):
    full = train(PAIRS, cfg("wal", epochs=4), tmp_path / "full", device="cpu")
    part = tmp_path / "part"
    train(PAIRS, cfg("wal", epochs=2), part, device="cpu")
    assert latest_checkpoint(part).name == "epoch_0001.pt"
    resumed = train(PAIRS, cfg("wal", epochs=4), part, device="cpu")
    assert [p["epoch"] for p in resumed["curve"]] == [p["epoch"] for p in full["curve"]] == [0, 1, 2, 3]
    for a, b in zip(full["curve"], resumed["curve"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-6)
        assert a["z0_share"] == b["z0_share"]
    assert resumed["t2v"] == pytest.approx(full["t2v"])
    # nothing left to do: a second resume trains no epoch and reports the same metrics
    again = train(PAIRS, cfg("wal", epochs=4), part, device="cpu")
    assert again["t2v"] == pytest.approx(full["t2v"])


def test_a_run_without_resume_leaves_no_epoch_of_the_run_before(tmp_path):
    train(PAIRS, cfg("nce", epochs=3), tmp_path, device="cpu")
    train(PAIRS, cfg("nce", epochs=1), tmp_path, device="cpu", resume=False)
    assert latest_checkpoint(tmp_path).name == "epoch_0000.pt"
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["epoch_0000.pt"]


def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    """A save that fails halfway (disk full, a kill) leaves the checkpoints as they were and no
    temporary file; the next run resumes from the last complete epoch."""
    train(PAIRS, cfg("nce", epochs=1), tmp_path, device="cpu")
    ckpt_dir = tmp_path / "checkpoints"
    before = (ckpt_dir / "epoch_0000.pt").read_bytes()
    real_save = torch.save

    def save_half(obj, f, *args, **kwargs):
        f.write(before[: len(before) // 2])
        raise OSError("No space left on device")

    monkeypatch.setattr(torch, "save", save_half)
    with pytest.raises(OSError, match="No space left"):
        train(PAIRS, cfg("nce", epochs=2), tmp_path, device="cpu")
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["epoch_0000.pt"]
    assert (ckpt_dir / "epoch_0000.pt").read_bytes() == before
    monkeypatch.setattr(torch, "save", real_save)
    resumed = train(PAIRS, cfg("nce", epochs=2), tmp_path, device="cpu")
    assert [p["epoch"] for p in resumed["curve"]] == [0, 1]
    assert latest_checkpoint(tmp_path).name == "epoch_0001.pt"


def test_evaluate_from_checkpoint(tmp_path):
    result = train(PAIRS, cfg("nce", epochs=2), tmp_path, device="cpu")
    again = evaluate(tmp_path, PAIRS, device="cpu")
    assert again["epoch"] == 1
    assert again["t2v"] == pytest.approx(result["t2v"])
    with pytest.raises(FileNotFoundError):
        evaluate(tmp_path / "nothing", PAIRS)


def test_protocol_comes_from_the_config_not_the_test_size():
    """1000 test pairs: "fixed" scores them as one set (WAL's 100, Torabi's 1000), "subsets"
    averages S-MiT's 5 random sets of 1000; fewer than 1000 under "subsets" says so."""
    from pipeline.train.evaluation import evaluate_model
    from pipeline.train.models import build_model

    rng = np.random.default_rng(0)
    n = 1000
    pairs = PairSet([f"p{i}" for i in range(n)], [f"g{i}" for i in range(n)], ["test"] * n,
                    list(rng.normal(size=(n, 6))), list(rng.normal(size=(n, 5))))
    model = build_model(cfg("max_margin"), 6, 5)
    fixed = evaluate_model(model, pairs, torch.device("cpu"), protocol="fixed")
    subsets = evaluate_model(model, pairs, torch.device("cpu"), protocol="subsets")
    assert fixed["protocol"] == "fixed_1000" and subsets["protocol"] == "subsets_5x1000"
    assert fixed["t2v"] == pytest.approx(subsets["t2v"])  # 5 draws of all 1000 pairs: the same set
    small = evaluate_model(model, pairs.subset(range(100)), torch.device("cpu"), protocol="subsets")
    assert small["protocol"] == "fixed_100" and "needs 1000 test pairs" in small["protocol_note"]


def test_cli_eval_on_flag(tmp_path):
    """`vlcorpus train` on a corpus without a test split exits 2 naming --eval-on; with
    --eval-on all it trains and metrics.json says split: all."""
    from typer.testing import CliRunner

    from pipeline.cli import app
    from pipeline.corpus.storage import Corpus

    root = tmp_path / "root"
    trainkit.synthetic_features(Corpus(str(root)), n=40, test_every=0)
    config = tmp_path / "c.yaml"
    config.write_text(f"name: syn\nroot: {root}\nsources:\n  - type: urls\n    urls: [http://127.0.0.1/x]\n"
                      "features:\n  extractors:\n    - {name: resnet34, weights: none}\n    - {name: 'text:x'}\n"
                      "train: {model: nce, visual: resnet34, text: 'text:x', epochs: 1, batch_size: 16,\n"
                      "        embed_dim: 8, finetune: false}\n")
    runner = CliRunner()
    refused = runner.invoke(app, ["train", str(config), "--device", "cpu"])
    assert refused.exit_code == 2 and "--eval-on all" in refused.output.replace("\n", " ")
    done = runner.invoke(app, ["train", str(config), "--device", "cpu", "--eval-on", "all"])
    assert done.exit_code == 0, done.output
    assert json.loads((root / "train" / "nce" / "metrics.json").read_text())["split"] == "all"


def test_the_report_reads_what_training_writes(tmp_path):
    """metrics.json as the trainer writes it is what the report's training section shows."""
    from pipeline.report.plots import curve_plot, recall_plot
    from pipeline.report.runs import training_runs
    from pipeline.corpus.storage import Corpus

    pairs = synth_pairs(val_groups=4)
    train(pairs, cfg("nce", epochs=2, select="val_recall"), tmp_path / "train" / "nce", device="cpu",
          source="a test")
    (run,) = training_runs(Corpus(str(tmp_path)))
    assert (run["model"], run["visual"], run["text"], run["source"]) == ("nce", ["v"], "t", "a test")
    assert run["pairs"] == {"train": 130, "val": 20, "test": 50} and run["dims"] == [32, 24]
    assert [d["direction"] for d in run["directions"]] == ["t2v", "v2t"]
    assert run["chance"]["R@1"] == 2.0 and run["n_test"] == 50
    assert run["selected"]["by"] == "val_recall" and [p["epoch"] for p in run["curve"]] == [0, 1]
    assert all(p["val"] is not None for p in run["curve"])
    assert recall_plot(run).startswith("data:image/png") and curve_plot(run).startswith("data:image/png")


def test_the_build_train_step_leaves_why_it_skipped_for_the_report(tmp_path):
    """Too little data (here no test split) skips training and leaves train/<model>/skipped.json,
    which the report shows; a training that runs removes it."""
    from pipeline.config import parse_config
    from pipeline.report.runs import training_runs
    from pipeline.runner import StageContext
    from pipeline.corpus.storage import Corpus
    from pipeline.train.run import train_step

    corpus = Corpus(str(tmp_path / "root"))
    corpus.init_partitions(1)
    rng = np.random.default_rng(0)

    def write_clips(splits):
        corpus.fs.rm(corpus.path("clips"), recursive=True) if corpus.fs.exists(corpus.path("clips")) else None
        clips = [{"clip_id": f"syn-v{i:02d}-0-3000", "video_id": f"syn-v{i:02d}", "start_s": 0.0, "end_s": 3.0,
                  "text": f"s{i}", "source": "manual", "policy": "fixed", "split": split}
                 for i, split in enumerate(splits)]
        corpus.write_partitioned("clips", clips, "syn", done=[c["video_id"] for c in clips])
        return [c["clip_id"] for c in clips]

    ids = write_clips(["train"] * 24)
    for table, extractor, dim in (("features/resnet34", "resnet34", 8), ("features/text_x", "text:x", 6)):
        corpus.write_partitioned(table, [{"clip_id": c, "extractor": extractor, "weights": "none", "shape": [dim],
                                          "values": rng.normal(size=dim).astype("float16")} for c in ids],
                                 "syn", done=ids)
    cfg = parse_config({"name": "syn", "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
                        "features": {"extractors": [{"name": "resnet34", "weights": "none"}, {"name": "text:x"}]},
                        "train": {"model": "nce", "visual": "resnet34", "text": "text:x", "epochs": 1,
                                  "batch_size": 8, "embed_dim": 8, "finetune": False}})
    skipped = train_step(StageContext(corpus, cfg))
    (run,) = training_runs(corpus)
    assert run["problem"] == f"training was skipped: {skipped['skipped']}" and "test" in skipped["skipped"]
    write_clips(["train"] * 16 + ["test"] * 8)
    assert "t2v" in train_step(StageContext(corpus, cfg))
    (run,) = training_runs(corpus)
    assert run["problem"] is None and run["skipped"] is None and run["pairs"] == {"train": 16, "test": 8}


def test_a_corpus_above_the_threshold_trains_streamed_and_learns_as_in_memory(tmp_path):
    """Above train.stream.above clips the pairs stream from the tables: the same corpus learns
    about as well as read whole, metrics.json says so and counts the pairs, and evaluating the
    checkpoint scores the same held-out sample."""
    from pipeline.config import parse_config
    from pipeline.corpus.storage import Corpus
    from pipeline.train.run import evaluate_corpus, train_corpus

    corpus = Corpus(str(tmp_path / "root"))
    trainkit.synthetic_features(corpus)

    def config(above):
        return parse_config({"name": "syn", "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
                             "features": {"extractors": [{"name": "resnet34", "weights": "none"}, {"name": "text:x"}]},
                             "train": {"model": "nce", "visual": "resnet34", "text": "text:x", "epochs": 5,
                                       "batch_size": 16, "embed_dim": 32, "lr": 0.01, **SMIT_FAST,
                                       "stream": {"above": above, "buffer": 40, "chunk": 16}}})

    memory = train_corpus(corpus, config(1000), out=tmp_path / "memory", device="cpu")
    streamed = train_corpus(corpus, config(100), out=tmp_path / "streamed", device="cpu")
    assert "streamed" not in memory["data"] and streamed["data"]["streamed"] == {"held_out_per_split": 5000}
    assert streamed["data"]["pairs"] == memory["data"]["pairs"] == {"test": 30, "train": 90}
    assert streamed["t2v"]["R@1"] > memory["t2v"]["R@1"] - 15  # chance: 3.3
    again = evaluate_corpus(corpus, config(100), checkpoint=tmp_path / "streamed", device="cpu")
    assert again["t2v"] == streamed["t2v"]
