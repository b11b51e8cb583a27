"""What the training loop reads: training batches per epoch and the held-out pairs, from pairs
in memory (`PairSet`) or streamed from a corpus's tables (`PairStream`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

import torch

from pipeline.config import TrainConfig
from pipeline.train.batches import BatchOptions, GroupBatchSampler, collate, epoch_rng
from pipeline.train.evaluation import EvalOn
from pipeline.train.pairs import PairSet, PairsError
from pipeline.train.stream import PairStream


class Feed(Protocol):
    held: PairSet  # val and test pairs (every pair with eval_on="all"): selection and evaluation

    def batches(self, epoch: int, opts: BatchOptions) -> Iterator[dict[str, torch.Tensor]]: ...

    def background(self) -> PairSet: ...

    def counts(self) -> dict[str, int]: ...


class MemoryFeed:
    """Pairs in memory: `GroupBatchSampler` over the train split, as the papers' loaders."""

    def __init__(self, pairs: PairSet, cfg: TrainConfig) -> None:
        self.held = pairs
        self.train = pairs.subset("train")
        if len(self.train) < 2:
            raise PairsError(f"training needs at least 2 train pairs, got {len(self.train)}")
        self.seed = cfg.seed
        self.sampler = GroupBatchSampler(self.train.groups, min(cfg.batch_size, len(self.train)), cfg.seed)

    def batches(self, epoch: int, opts: BatchOptions) -> Iterator[dict[str, torch.Tensor]]:
        rng = epoch_rng(self.seed, epoch)
        for idx in self.sampler.batches(epoch):
            yield collate(self.train, idx, opts, rng)

    def background(self) -> PairSet:
        return self.train

    def counts(self) -> dict[str, int]:
        splits = self.held.splits
        return {split: splits.count(split) for split in sorted(set(splits))}


class StreamFeed:
    """Pairs streamed: shuffled batches of the train split from the stream's buffer; the held-out
    pairs a bounded sample of each split (of train too with eval_on="all")."""

    def __init__(self, stream: PairStream, cfg: TrainConfig, eval_on: EvalOn) -> None:
        self.stream = stream
        self.cfg = cfg
        splits = ("train", "val", "test") if eval_on == "all" else ("val", "test")
        n = stream.clip_count("train")
        if n < 2:
            raise PairsError(f"training needs at least 2 train pairs, got {n} train clips")
        self.held = stream.sample(splits, cfg.stream.held_out, cfg.seed)

    def batches(self, epoch: int, opts: BatchOptions) -> Iterator[dict[str, torch.Tensor]]:
        rng = epoch_rng(self.cfg.seed, epoch)
        shuffle = epoch_rng(self.cfg.seed, epoch, 3)
        for pairs, idx in self.stream.batches("train", self.cfg.batch_size, shuffle):
            yield collate(pairs, idx, opts, rng)

    def background(self) -> PairSet:
        return self.stream.sample(("train",), self.cfg.stream.held_out, self.cfg.seed)

    def counts(self) -> dict[str, int]:
        return {split: n for split, n in sorted(self.stream.counts.items()) if n}


def feed_for(pairs: PairSet | PairStream, cfg: TrainConfig, eval_on: EvalOn) -> Feed:
    if isinstance(pairs, PairStream):
        return StreamFeed(pairs, cfg, eval_on)
    return MemoryFeed(pairs, cfg)


def held_out(pairs: PairSet | PairStream, cfg: TrainConfig, eval_on: EvalOn) -> PairSet:
    """The pairs evaluation scores: all of them in memory, a bounded sample of a stream."""
    if isinstance(pairs, PairStream):
        splits = ("train", "val", "test") if eval_on == "all" else ("test",)
        return pairs.sample(splits, cfg.stream.held_out, cfg.seed)
    return pairs

