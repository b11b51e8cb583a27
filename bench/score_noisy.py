"""Scoring and filtering noisy pairs: does a model's score find the misaligned pairs, and does a
model trained on the pairs the score keeps retrieve better than one trained on all of them?

Data: bench/noisy_pairs.py's synthetic pairs (`make_pairs`: 100 training videos of 10 clips,
25 clean test videos), a share of the training pairs mismatched — noise "swap": the sentence of
a random clip of another video; "shift": a video's whole narration shifted by 1-2 clips — and
written as a corpus's clips and features tables (`PairSet.to_corpus`), so that everything below
is the pipeline's own code on a real corpus root. Per seed, noise and rate:

1. train the model (WAL-att-adv by default, at noisy_pairs.py's settings) on all pairs
   (`train_corpus`, as `vlcorpus train` does);
2. score every clip with the score stage (`run_stage`, as `vlcorpus build --stage score`);
   ROC AUC of the score against the known mismatched training pairs (1 = every aligned pair
   scores above every mismatched one, 0.5 = chance), for the similarity (what the shards carry
   by default), minus the rank among the video's sentences, and WAL-att-adv's P(aligned);
3. filter the training pairs by the score with the shard stage (`write_shards`, the test split
   whole) two ways, each keeping half: `shards.score_top_fraction: 0.5` (the better half of
   every video) and `shards.min_score` at the median training score (the better half of the
   corpus; the threshold is read off the scores, no labels);
4. train again on the filtered Parquet shards (`train_corpus(shards=...)`, `vlcorpus train
   --shards`), and, as the ceiling, on the clean training pairs only (which the labels give);
5. R@1, R@5, R@10 on the clean test split, mean of text->video and video->text.

With --demo ROOT, the same measurement on a demo corpus (`vlcorpus demo --root DIR --videos 40
--until featurize`, ROOT = DIR/corpus): a share of its training sentences (the clip's text and
its text features) swapped for the sentence of a random clip of another video, the model of
configs/demo.yaml (WAL-att-adv on untrained ResNet-34 frames and MiniLM sentences); the
ceiling row is the same corpus before the swaps.

Usage: python bench/score_noisy.py [--quick] [--seeds 3] [--noise swap,shift] [--rates 0.3,0.5]
       [--models WAL-att-adv,NCE] [--epochs 40]
       python bench/score_noisy.py --demo DIR/corpus [--seeds 3] [--rates 0.3]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from noisy_pairs import MODELS, Sizes, auc, make_pairs  # noqa: E402
from noisy_pairs import config as bench_config  # noqa: E402

from pipeline.config import Config, load_config, parse_config  # noqa: E402
from pipeline.runner import run_stage  # noqa: E402
from pipeline.score.stage import make_stage  # noqa: E402
from pipeline.shards import open_parquet, write_shards  # noqa: E402
from pipeline.compose.stages import context  # noqa: E402
from pipeline.corpus.storage import Corpus  # noqa: E402
from pipeline.train.batches import GroupBatchSampler  # noqa: E402
from pipeline.train.loop import train  # noqa: E402
from pipeline.train.run import train_corpus  # noqa: E402

VISUAL, TEXT = "resnet34", "text:synthetic"  # the names the synthetic features are stored under
ROWS = ("all pairs", "top half per video", "min_score: median", "clean pairs only")


def with_keys(cfg: Config, **sections: dict) -> Config:
    """`cfg` with the keys of `sections` set (validated again)."""
    data = cfg.model_dump(mode="json")
    for name, keys in sections.items():
        data[name] = {**(data.get(name) or {}), **keys}
    return parse_config(data)


def corpus_config(root: Path, label: str, args: argparse.Namespace, seed: int, steps: int) -> Config:
    """The synthetic corpus's config: noisy_pairs.py's training settings for `label` and a
    score section."""
    train_cfg = bench_config(label, args.epochs, seed, args.embed_dim, args.batch_size, steps, 0.05)
    return parse_config({
        "name": "score-noisy", "root": str(root), "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
        "features": {"extractors": [{"name": VISUAL, "weights": "none"}, {"name": TEXT}]},
        "train": {**train_cfg.model_dump(), "visual": VISUAL, "text": TEXT},
        "score": {"device": "cpu"},
        "shards": {"samples_per_shard": 2000},
    })


def recall(metrics: dict) -> list[float]:
    """R@1, R@5, R@10, each the mean of both directions."""
    return [float(np.mean([metrics[d][f"R@{k}"] for d in ("t2v", "v2t")])) for k in (1, 5, 10)]


def measure(corpus: Corpus, cfg: Config, mismatched: dict[str, bool]) -> dict:
    """On a corpus whose training clips' mismatch is known (`mismatched`: clip id -> bool):
    train on all pairs, score, the AUCs, then each filter's shards and a model trained on them."""
    root = Path(corpus.root)
    out: dict = {"auc": {}, "recall": {}, "kept_mismatched": {}}
    out["recall"]["all pairs"] = recall(train_corpus(corpus, cfg, device="cpu"))
    report = run_stage(make_stage(cfg), context(corpus, cfg), cfg.score.batch_size)
    assert report.ok == corpus.read("clips").num_rows, report
    scores = {r["clip_id"]: r for r in corpus.read(cfg.score_table).to_pylist()}
    ids = sorted(mismatched)
    is_bad = np.array([mismatched[c] for c in ids])
    for name, sign in (("similarity", 1), ("rank", -1), ("p_aligned", 1)):
        values = [scores[c][name] for c in ids]
        if any(v is None for v in values):
            continue
        v = sign * np.asarray(values, dtype=np.float64)
        out["auc"][name] = auc(v[~is_bad], v[is_bad])
    median = float(np.median([scores[c]["similarity"] for c in ids]))
    filters = {"top half per video": {"score_top_fraction": 0.5}, "min_score: median": {"min_score": median}}
    for row, keys in filters.items():
        shutil.rmtree(root / "shards", ignore_errors=True)
        filtered = with_keys(cfg, shards=keys)
        write_shards(context(corpus, filtered))
        shards = str(root / "shards" / "parquet")
        kept = set(open_parquet(shards).to_table(columns=["clip_id"]).column("clip_id").to_pylist())
        out["kept_mismatched"][row] = (float(np.mean([mismatched[c] for c in ids if c in kept])),
                                       sum(c in kept for c in ids))
        metrics = train_corpus(corpus, filtered, out=root / "train" / row.replace(" ", "_").replace(":", ""),
                               device="cpu", shards=shards)
        out["recall"][row] = recall(metrics)
    out["kept_mismatched"]["all pairs"] = (float(is_bad.mean()), len(ids))
    out["n_test"] = metrics["n_test"]
    return out


def one_run(label: str, noise: str, rate: float, seed: int, args: argparse.Namespace, sizes: Sizes) -> dict:
    """The synthetic corpus of one seed, noise and rate."""
    pairs, bad = make_pairs(rate, seed, sizes, noise)
    train_idx = [i for i, s in enumerate(pairs.splits) if s == "train"]
    steps = len(GroupBatchSampler([pairs.groups[i] for i in train_idx], args.batch_size))
    with tempfile.TemporaryDirectory(prefix="vlcorpus-score-noisy-") as tmp:
        root = Path(tmp) / "root"
        corpus = Corpus(str(root))
        ids = pairs.to_corpus(corpus, VISUAL, TEXT)
        cfg = corpus_config(root, label, args, seed, steps)
        out = measure(corpus, cfg, {ids[i]: bool(bad[i]) for i in train_idx})
        clean = [i for i in range(len(pairs)) if not bad[i]]
        out["recall"]["clean pairs only"] = recall(train(pairs.subset(clean), cfg.train, root / "train" / "clean",
                                                         device="cpu"))
    return out


def swapped_demo(source: Corpus, root: Path, rate: float, seed: int) -> dict[str, bool]:
    """A copy of a demo corpus's clips and features tables into `root` with `rate` of its
    training sentences (the clip's text and its text features) swapped for the sentence of a
    random clip of another video; returns the training clips' mismatch."""
    rng = np.random.default_rng([seed, 20])
    clips = source.read("clips").to_pylist()
    tables = [t for t in source.family_tables("features")]
    text_tables = [t for t in tables if t.split("/", 1)[1].startswith("text_")]
    rows = {t: {r["clip_id"]: r for r in source.read(t).to_pylist()} for t in tables}
    train_idx = [i for i, c in enumerate(clips) if c["split"] == "train"]
    swapped = set(rng.choice(train_idx, round(rate * len(train_idx)), replace=False).tolist())
    originals = [dict(c) for c in clips]
    for i in sorted(swapped):
        clip = clips[i]
        j = int(rng.choice([k for k, c in enumerate(originals) if c["video_id"] != clip["video_id"]]))
        clip["text"] = originals[j]["text"]
        for t in text_tables:
            rows[t][clip["clip_id"]] = {**rows[t][originals[j]["clip_id"]], "clip_id": clip["clip_id"]}
    corpus = Corpus(str(root))
    corpus.init_partitions(source.partitions)
    corpus.write_partitioned("clips", clips, "swapped", done=sorted({c["video_id"] for c in clips}))
    for t in tables:
        corpus.write_partitioned(t, list(rows[t].values()), "swapped", done=sorted(rows[t]))
    return {clips[i]["clip_id"]: i in swapped for i in train_idx}


def demo_run(source: Corpus, config: Path, rate: float, seed: int) -> dict:
    """The demo corpus with `rate` of its training sentences swapped, at the demo's training
    settings (the config's, seed `seed`); the ceiling is the same corpus unswapped."""
    with tempfile.TemporaryDirectory(prefix="vlcorpus-score-demo-") as tmp:
        root = Path(tmp) / "root"
        mismatched = swapped_demo(source, root, rate, seed)
        base = load_config(config)
        cfg = with_keys(base, train={"seed": seed}, score={"device": "cpu"})
        cfg = parse_config({**cfg.model_dump(mode="json"), "root": str(root)})
        out = measure(Corpus(str(root)), cfg, mismatched)
        clean = Path(tmp) / "clean"
        swapped_demo(source, clean, 0.0, seed)
        clean_cfg = parse_config({**cfg.model_dump(mode="json"), "root": str(clean)})
        out["recall"]["clean pairs only"] = recall(train_corpus(Corpus(str(clean)), clean_cfg, device="cpu"))
    return out


def fmt(values: list[float], digits: int = 1) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{np.mean(values):.{digits}f}±{np.std(values, ddof=1):.{digits}f}"


def print_setting(title: str, results: list[dict], ceiling: str) -> None:
    print(f"\n{title}")
    print("  ROC AUC of the score against the mismatched training pairs (per seed):")
    for name in results[0]["auc"]:
        values = [r["auc"][name] for r in results]
        shown = {"rank": "-rank"}.get(name, name)
        print(f"    {shown:<11} {fmt(values, 3):>12}  [{', '.join(f'{v:.3f}' for v in values)}]")
    print(f"  {'trained on':<20} {'R@1':>10} {'R@5':>10} {'R@10':>10}   mismatched share of its training pairs")
    for row in ROWS:
        cells = " ".join(f"{fmt([r['recall'][row][k] for r in results]):>10}" for k in range(3))
        if row in results[0]["kept_mismatched"]:
            share = fmt([r["kept_mismatched"][row][0] for r in results], 3)
            kept = f"{share} of {fmt([r['kept_mismatched'][row][1] for r in results], 0)}"
        else:
            kept = ceiling
        print(f"  {row:<20} {cells}   {kept}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60+15 videos, 20 epochs, 1 seed, swap at 0.3")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--noise", default="swap,shift")
    parser.add_argument("--rates", default="0.3,0.5", help="mismatched share of the training pairs")
    parser.add_argument("--models", default="WAL-att-adv", help=f"labels of noisy_pairs.py: {', '.join(MODELS)}")
    parser.add_argument("--epochs", type=int, default=None, help="default 40 (--quick: 20)")
    parser.add_argument("--embed-dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--demo", type=Path, default=None, metavar="ROOT",
                        help="instead: a demo corpus built up to featurize (vlcorpus demo --until featurize), "
                             "its training sentences swapped at --rates (default 0.3), trained as --demo-config says")
    parser.add_argument("--demo-config", type=Path,
                        default=Path(__file__).resolve().parents[1] / "configs" / "demo.yaml")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as noisy_pairs.py: repeatable, and the machine stays usable
    started = time.perf_counter()
    if args.demo is not None:
        source = Corpus(str(args.demo))
        rates = [float(r) for r in (args.rates if args.rates != "0.3,0.5" else "0.3").split(",")]
        clips = source.read("clips", columns=["split"]).column("split").to_pylist()
        print(f"score_noisy --demo {args.demo}: {len(clips)} clips ({clips.count('train')} train, "
              f"{clips.count('test')} test), training sentences swapped for one of another video; "
              f"{args.demo_config.name}'s training; seeds 0-{args.seeds - 1}{', mean±sd' if args.seeds > 1 else ''}")
        for rate in rates:
            results = [demo_run(source, args.demo_config, rate, seed) for seed in range(args.seeds)]
            n_test = results[0]["n_test"]
            print_setting(f"{rate:g} of the training sentences swapped; {n_test} test pairs (chance R@1 "
                          f"{100 / n_test:.1f}, R@5 {500 / n_test:.1f}, R@10 {1000 / n_test:.1f})",
                          results, "0 (the corpus before the swaps)")
        print(f"\n{len(rates) * args.seeds} runs in {time.perf_counter() - started:.0f} s")
        return
    if args.quick:
        args.seeds, args.noise, args.rates = 1, "swap", "0.3"
    args.epochs = args.epochs or (20 if args.quick else 40)
    sizes = Sizes(train_videos=60, test_videos=15) if args.quick else Sizes()
    labels = [m.strip() for m in args.models.split(",")]
    unknown = [m for m in labels if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    settings = [(label, noise.strip(), float(rate)) for label in labels for noise in args.noise.split(",")
                for rate in args.rates.split(",")]
    runs = {s: [one_run(*s, seed, args, sizes) for seed in range(args.seeds)] for s in settings}
    n_test = sizes.test_videos * sizes.clips
    print(f"score_noisy: {sizes.train_videos} train videos x {sizes.clips} clips, {sizes.test_videos} clean test "
          f"videos ({n_test} pairs, chance R@1 {100 / n_test:.1f}, R@5 {500 / n_test:.1f}, R@10 {1000 / n_test:.1f}); "
          f"{args.epochs} epochs; seeds 0-{args.seeds - 1}{', mean±sd' if args.seeds > 1 else ''}")
    for (label, noise, rate), results in runs.items():
        print_setting(f"{label}, noise {noise}, {rate:g} of the training pairs mismatched", results,
                      "0 (the labels pick them)")
    print(f"\n{sum(len(r) for r in runs.values())} runs in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
