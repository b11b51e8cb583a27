"""Training and evaluation on a corpus's features, for the CLI and the build's train stage."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import fsspec

from pipeline.config import Config
from pipeline.progress import log
from pipeline.runner import StageContext
from pipeline.corpus.storage import Corpus
from pipeline.train import freshness
from pipeline.train.pairs import PairSet, PairsError
from pipeline.train.evaluation import EvalOn
from pipeline.train.loop import evaluate, train
from pipeline.train.stream import PairStream

SKIPPED = "skipped.json"


def listed_test_only(pairs: PairSet, clip_ids: set[str]) -> PairSet:
    """The pairs with the test split cut down to the listed clips (WAL: the 100 hand-checked
    pairs). align holds their videos out whole, so the other clips of those videos are neither
    trained on nor scored."""
    keep = [i for i, (pid, split) in enumerate(zip(pairs.pair_ids, pairs.splits))
            if split != "test" or pid in clip_ids]
    return pairs.subset(keep)


def pairs_for(corpus: Corpus, cfg: Config, pairs_file: str | None = None,
              shards: str | None = None) -> PairSet | PairStream:
    """Pairs from an external pairs file, or from shards (WebDataset or Parquet), else from the
    corpus's features tables: read whole, or streamed when the clips table has more rows than
    train.stream.above; with align.test_clip_ids, only the listed clips are test pairs."""
    if pairs_file and shards:
        raise ValueError("give a pairs file or shards, not both")
    if pairs_file:
        return PairSet.from_pairs_file(pairs_file)
    assert cfg.train is not None
    visual = cfg.train.visual_names
    listed = None
    if cfg.align.test_clip_ids:
        with fsspec.open(cfg.align.test_clip_ids, "rt") as handle:
            listed = frozenset(line.strip() for line in handle if line.strip())
    if not shards and corpus.dataset("clips").count_rows() > cfg.train.stream.above:
        return PairStream(corpus, visual, cfg.train.text, cfg.train.stream, listed)
    if shards:
        pairs = PairSet.from_shards(shards, visual, cfg.train.text)
    else:
        pairs = PairSet.from_corpus(corpus, visual, cfg.train.text)
    return pairs if listed is None else listed_test_only(pairs, listed)


def train_folder(cfg: Config) -> str:
    """``train/<model>`` in the corpus: checkpoints, metrics.json, curve.png."""
    assert cfg.train is not None
    return f"train/{cfg.train.model}"


def train_corpus(corpus: Corpus, cfg: Config, out: Path | None = None, device: str = "auto",
                 resume: bool = True, pairs_file: str | None = None,
                 shards: str | None = None, eval_on: EvalOn = "test") -> dict[str, Any]:
    """Train on the corpus into ``out``, by default its ``train/<model>`` (on a remote root,
    trained in a local copy that is uploaded when training ends)."""
    if cfg.train is None:
        raise ValueError("the config has no `train` section")
    source = (f"pairs file {pairs_file}" if pairs_file else f"shards {shards}" if shards
              else "the corpus's features tables")
    pairs = pairs_for(corpus, cfg, pairs_file, shards)
    with contextlib.nullcontext(str(out)) if out else corpus.local_folder(train_folder(cfg)) as folder:
        return train(pairs, cfg.train, Path(folder), device=device, resume=resume, eval_on=eval_on,
                     source=source)


def evaluate_corpus(corpus: Corpus, cfg: Config, checkpoint: Path | None = None,
                    device: str = "auto", pairs_file: str | None = None,
                    shards: str | None = None, eval_on: EvalOn = "test") -> dict[str, Any]:
    if cfg.train is None and checkpoint is None:
        raise ValueError("the config has no `train` section; pass a checkpoint")
    pairs = pairs_for(corpus, cfg, pairs_file, shards)
    with (contextlib.nullcontext(str(checkpoint)) if checkpoint
          else corpus.local_folder(train_folder(cfg), write=False)) as folder:
        return evaluate(Path(folder), pairs, device=device, eval_on=eval_on)


def train_step(ctx: StageContext) -> dict[str, Any]:
    """The build's train stage: runs when the config has a `train` section, and trains when
    `pipeline.train.freshness` finds the checkpoint there stale."""
    cfg: Config = ctx.config
    if cfg.train is None:
        return {"skipped": "no train section"}
    folder = train_folder(cfg)
    decision = freshness.decide(ctx.corpus, cfg, folder)
    if not decision.train:
        log.info("train skipped: %s", decision.reason)
        return {"skipped": decision.reason}
    log.info("training %s: %s", folder, decision.reason)
    if decision.start_over:
        freshness.start_over(ctx.corpus, folder)
    # Why the newest build did not train, for the report (train/<model>/skipped.json).
    note = f"{folder}/{SKIPPED}"
    try:
        metrics = train_corpus(ctx.corpus, cfg)
    except PairsError as exc:
        # Too little data to train on (or no test split) is a fact about this corpus, not a failed build.
        log.warning("train skipped: %s", exc)
        ctx.corpus.write_text(note, json.dumps({"reason": str(exc), "time": time.strftime(
            "%Y%m%dT%H%M%SZ", time.gmtime())}) + "\n")
        return {"skipped": str(exc)}
    if ctx.corpus.fs.exists(ctx.corpus.path(note)):
        ctx.corpus.fs.rm(ctx.corpus.path(note))
    freshness.record(ctx.corpus, cfg, folder, decision)
    keys = ("t2v", "v2t", "mc_acc", "n_test", "protocol", "split")
    return {**{k: metrics.get(k) for k in keys}, "out": ctx.corpus.path(folder)}
