"""A build's train step trains only when its checkpoint is stale (pipeline/train/freshness.py):
unchanged inputs train nothing; growth keeps the checkpoint when train.retrain_growth is unset (the
default), and a growth under it when set, so the score stage scores only the new clips; more
growth, counted since the checkpoint's training, a changed train section or retrain_growth 0
train again, from scratch, and every clip is scored again; a checkpoint without a record is
resumed and recorded."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

import trainkit
from pipeline.config import parse_config
from pipeline.runner import plan_partition, run_stage
from pipeline.score.stage import make_stage
from pipeline.compose.stages import context
from pipeline.compose.status import status_key
from pipeline.corpus.storage import Corpus
from pipeline.train.freshness import RECORD, count_pairs, decide, input_tables
from pipeline.train.pairs import PairSet
from pipeline.train.run import train_corpus, train_step

PAIRS, _ = trainkit.noisy_pairs(videos=24)
FIRST = 20  # videos of the first build: 100 pairs


def _config(root: Path, **train):
    return parse_config({
        "name": "fresh", "root": str(root), "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "features": {"extractors": [{"name": "resnet34", "weights": "none"}, {"name": "text:synthetic"}]},
        "train": {"model": "wal", "visual": "resnet34", "text": "text:synthetic", "epochs": 2, "embed_dim": 16,
                  "batch_size": 32, "lr_milestones": [], "options": {}, **train},
        "score": {"batch_size": 50, "device": "cpu"},
    })


def _videos(corpus: Corpus, videos: range) -> None:
    """Add the pairs of these videos (v00, v01, ...) to the corpus's clips and features."""
    groups = {f"v{v:02d}" for v in videos}
    PAIRS.subset([i for i, g in enumerate(PAIRS.groups) if g in groups]).to_corpus(
        corpus, "resnet34", "text:synthetic", batch=f"v{videos.start:02d}")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "train").rglob("*")) if p.is_file()}


def _scores(corpus: Corpus) -> dict[str, dict]:
    return {r["clip_id"]: r for r in corpus.read("scores/wal").to_pylist()}


def _plans(corpus: Corpus, cfg) -> tuple[int, int]:
    """Clips to score again (another checkpoint's rows) and clips to score, over the partitions."""
    stage, ctx = make_stage(cfg), context(corpus, cfg)
    plans = [plan_partition(stage, ctx, p) for p in corpus.labels()]
    return sum(len(p.redo) for p in plans), sum(p.report.todo for p in plans)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """20 videos x 5 clips, trained by the train step and scored: a build's first run."""
    root = tmp_path_factory.mktemp("fresh") / "root"
    corpus = Corpus(str(root))
    _videos(corpus, range(FIRST))
    cfg = _config(root)
    trained = train_step(context(corpus, cfg))
    assert "t2v" in trained
    assert run_stage(make_stage(cfg), context(corpus, cfg), batch_size=50).ok == 100
    return root


def _copy(built: Path, path: Path) -> Corpus:
    shutil.copytree(built, path)  # file times kept: the copy's tables have the original's fingerprint
    return Corpus(str(path))


def test_unchanged_inputs_train_nothing(built, tmp_path, caplog):
    root = tmp_path / "root"
    corpus = _copy(built, root)
    cfg = _config(root)
    record = json.loads((root / "train" / "wal" / RECORD).read_text())
    assert record["pairs"] == 100 and record["checkpoint"].startswith("file:train/wal/checkpoints/epoch_0001.pt#")
    assert record["config"]["model"] == "wal" and "retrain_growth" not in record["config"]
    before = _files(root)
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        result = train_step(context(corpus, cfg))
    assert result == {"skipped": "its inputs have not changed since train/wal/checkpoints/epoch_0001.pt was trained"}
    assert f"train skipped: {result['skipped']}" in caplog.text
    assert _files(root) == before  # checkpoints, metrics and the record byte for byte
    # retrain_growth decides when to train, not what: changing it trains nothing, and keeps the
    # partitions' status summaries.
    other = _config(root, retrain_growth=0.5)
    assert "skipped" in train_step(context(corpus, other))
    assert status_key(corpus, other) == status_key(corpus, cfg)
    assert _plans(corpus, cfg) == (0, 0)


def test_growth_alone_trains_nothing_while_retrain_growth_is_unset(built, tmp_path):
    root = tmp_path / "root"
    corpus = _copy(built, root)
    cfg = _config(root)
    before = _files(root)
    _videos(corpus, range(FIRST, FIRST + 4))  # 20 more pairs: 20 %
    result = train_step(context(corpus, cfg))
    assert result == {"skipped": "its tables changed since train/wal/checkpoints/epoch_0001.pt was trained, "
                                 "and train.retrain_growth is unset: kept"}
    assert _files(root) == before
    assert _plans(corpus, cfg) == (0, 20)  # the new clips alone


def test_a_small_growth_keeps_the_checkpoint_and_scores_only_the_new_clips(built, tmp_path):
    root = tmp_path / "root"
    corpus = _copy(built, root)
    cfg = _config(root, retrain_growth=0.1)
    before, scored = _files(root), _scores(corpus)
    _videos(corpus, range(FIRST, FIRST + 1))  # 5 more pairs: 5 %, under 10 %
    result = train_step(context(corpus, cfg))
    assert result["skipped"] == ("the pairs went from 100 to 105 (5.0%) since train/wal/checkpoints/epoch_0001.pt "
                                 "was trained, under train.retrain_growth (10.0%): kept")
    assert _files(root) == before
    assert _plans(corpus, cfg) == (0, 5)
    report = run_stage(make_stage(cfg), context(corpus, cfg), batch_size=50)
    assert report.ok == 5 and report.skipped_done == 100
    after = _scores(corpus)
    assert len(after) == 105 and {k: after[k] for k in scored} == scored  # the old rows untouched

    # Growth counts from the checkpoint's training, not from the last build: 5 more is 10 %.
    _videos(corpus, range(FIRST + 1, FIRST + 2))
    result = train_step(context(corpus, cfg))
    assert "t2v" in result
    record = json.loads((root / "train" / "wal" / RECORD).read_text())
    assert record["pairs"] == 110 and record["checkpoint"] != json.loads(before[f"train/wal/{RECORD}"])["checkpoint"]
    assert _plans(corpus, cfg) == (105, 110)  # a new checkpoint: every clip is scored again
    assert run_stage(make_stage(cfg), context(corpus, cfg), batch_size=50).ok == 110
    assert len({r["checkpoint"] for r in _scores(corpus).values()}) == 1


def test_a_changed_train_section_trains_again_from_scratch(built, tmp_path, caplog):
    root = tmp_path / "root"
    corpus = _copy(built, root)
    cfg = _config(root, epochs=1)
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        result = train_step(context(corpus, cfg))
    assert "t2v" in result
    assert "the train section changed since train/wal/checkpoints/epoch_0001.pt was trained (epochs)" in caplog.text
    # From scratch: the old run's epoch 1 would otherwise stay the newest checkpoint.
    assert sorted(p.name for p in (root / "train" / "wal" / "checkpoints").iterdir()) == ["epoch_0000.pt"]
    assert json.loads((root / "train" / "wal" / "metrics.json").read_text())["config"]["epochs"] == 1
    assert _plans(corpus, cfg) == (100, 100)
    assert "skipped" in train_step(context(corpus, cfg))  # and recorded


def test_retrain_growth_zero_trains_on_any_change(built, tmp_path):
    root = tmp_path / "root"
    corpus = _copy(built, root)
    cfg = _config(root, retrain_growth=0)
    assert "skipped" in train_step(context(corpus, cfg))  # nothing changed
    _videos(corpus, range(FIRST, FIRST + 1))
    before = _files(root)
    assert "t2v" in train_step(context(corpus, cfg))
    checkpoint = "train/wal/checkpoints/epoch_0001.pt"
    assert _files(root)[checkpoint] != before[checkpoint]
    assert _plans(corpus, cfg) == (100, 105)


def test_a_checkpoint_without_a_record_is_resumed_and_recorded(built, tmp_path, caplog):
    """A training cut off, one from before records, or one `vlcorpus train` made: resumed, which
    here, its epochs all done, only evaluates; the checkpoint stays, and so do its scores."""
    root = tmp_path / "root"
    corpus = _copy(built, root)
    cfg = _config(root)
    (root / "train" / "wal" / RECORD).unlink()
    checkpoints = {k: v for k, v in _files(root).items() if "/checkpoints/" in k}
    with caplog.at_level(logging.INFO, logger="vlcorpus"):
        assert "t2v" in train_step(context(corpus, cfg))
    assert "no record of what train/wal/checkpoints/epoch_0001.pt was trained on: resumed" in caplog.text
    assert {k: v for k, v in _files(root).items() if "/checkpoints/" in k} == checkpoints
    assert (root / "train" / "wal" / RECORD).exists()
    assert "skipped" in train_step(context(corpus, cfg))
    assert _plans(corpus, cfg) == (0, 0)

    # `vlcorpus train` with one more epoch: its checkpoint is not the recorded one.
    train_corpus(corpus, _config(root, epochs=3), device="cpu")
    assert decide(corpus, cfg, "train/wal").reason.startswith("no record of what train/wal/checkpoints/epoch_0002.pt")


def test_pairs_are_counted_from_the_summaries(built, tmp_path):
    corpus = _copy(built, tmp_path / "root")
    tables = input_tables(_config(tmp_path / "root").train)
    assert tables == ["clips", "features/resnet34", "features/text_synthetic"]
    assert count_pairs(corpus, tables) == len(PairSet.from_corpus(corpus, "resnet34", "text:synthetic")) == 100


def test_on_an_object_store_root(memory_root):
    """fsspec memory:// (S3 in the rehearsal): the record and the fingerprints are read from the
    root, and starting over removes the old checkpoints there."""
    corpus = Corpus(memory_root)
    _videos(corpus, range(FIRST))
    cfg = _config(memory_root)
    assert "t2v" in train_step(context(corpus, cfg))
    assert train_step(context(corpus, cfg))["skipped"].startswith("its inputs have not changed")
    changed = _config(memory_root, epochs=1)
    assert "t2v" in train_step(context(corpus, changed))
    saved = corpus.fs.find(corpus.path("train", "wal", "checkpoints"))
    assert [p.rsplit("/", 1)[1] for p in saved] == ["epoch_0000.pt"]
    assert "skipped" in train_step(context(corpus, changed))
