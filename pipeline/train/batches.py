"""Training batches from a `PairSet`: `GroupBatchSampler` (in-batch negatives, one pair per
video per batch where possible) and `collate` (frame sampling N_f with reuse, MIL-NCE windows,
S-MiT word sampling, WAL balanced positives/negatives, MIL-NCE candidate bags).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.train.pairs import PairSet, PairsError


def epoch_rng(seed: int, epoch: int, stream: int = 0) -> np.random.Generator:
    """The numpy generator of one epoch: a function of (seed, epoch), so a resumed run draws
    the same batches as an uninterrupted one."""
    return np.random.default_rng([seed, epoch, stream])


class GroupBatchSampler:
    """Shuffled batches of indices with one pair per group (video) per batch where possible:
    each group's pairs are shuffled and dealt round by round, so a batch only repeats a video
    once every group has given one. Batches smaller than `min_batch` are dropped."""

    def __init__(self, groups: Sequence[str], batch_size: int, seed: int = 0, min_batch: int = 2) -> None:
        self.groups = list(groups)
        self.batch_size = batch_size
        self.seed = seed
        self.min_batch = min_batch

    def batches(self, epoch: int) -> list[list[int]]:
        rng = epoch_rng(self.seed, epoch, 1)
        by_group: dict[str, list[int]] = {}
        for i, g in enumerate(self.groups):
            by_group.setdefault(g, []).append(i)
        keys = []
        for members in by_group.values():
            perm = rng.permutation(members)
            keys += [(rank, rng.random(), int(i)) for rank, i in enumerate(perm)]
        keys.sort()
        order = [i for _, _, i in keys]
        taken = np.zeros(len(order), dtype=bool)
        out = []
        start = 0  # first position not yet taken
        while start < len(order):
            batch, used = [], set()
            j = start
            while len(batch) < self.batch_size and j < len(order):
                i = order[j]
                if not taken[j] and self.groups[i] not in used:
                    batch.append(i)
                    used.add(self.groups[i])
                    taken[j] = True
                j += 1
            j = start
            while len(batch) < self.batch_size and j < len(order):  # too few groups left: repeat
                if not taken[j]:
                    batch.append(order[j])
                    taken[j] = True
                j += 1
            while start < len(order) and taken[start]:
                start += 1
            if len(batch) >= self.min_batch:
                out.append(batch)
        return out

    def __len__(self) -> int:
        return len(self.batches(0))


def sample_frames(n_frames: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """N_f frame indices in time order (WAL): a random subset when the clip has enough frames,
    else every frame once plus random repeats."""
    if n_frames >= n:
        return np.sort(rng.choice(n_frames, n, replace=False))
    return np.sort(np.concatenate([np.arange(n_frames), rng.choice(n_frames, n - n_frames, replace=True)]))


def sample_window(n_rows: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """MIL-NCE (4.1): a random window of `window` consecutive feature rows inside the clip (the
    narration's span); a clip no longer than the window is used whole."""
    if n_rows <= window:
        return np.arange(n_rows)
    start = int(rng.integers(0, n_rows - window + 1))
    return np.arange(start, start + window)


def sample_words(n_words: int, n: int, rng: np.random.Generator, repeat: bool = True) -> np.ndarray:
    """S-MiT: `n` word indices per caption, with repeats when it has fewer (repeat=False: all of
    them, no repeats)."""
    if n_words >= n:
        return np.sort(rng.choice(n_words, n, replace=False))
    if not repeat:
        return np.arange(n_words)
    return np.sort(np.concatenate([np.arange(n_words), rng.choice(n_words, n - n_words, replace=True)]))


def pad(arrays: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, L, D] zero-padded and the [B, L] bool mask of real rows; [D] arrays count as L=1."""
    arrays = [np.atleast_2d(a) for a in arrays]
    length = max(a.shape[0] for a in arrays)
    out = np.zeros((len(arrays), length, arrays[0].shape[1]), dtype=np.float32)
    mask = np.zeros((len(arrays), length), dtype=bool)
    for i, a in enumerate(arrays):
        out[i, : len(a)] = a
        mask[i, : len(a)] = True
    return torch.from_numpy(out), torch.from_numpy(mask)


@dataclass
class BatchOptions:
    """How `collate` draws a batch: window (MIL-NCE: a random run of this many consecutive
    frames first, None = the whole clip), n_frames (N_f, None = every frame), n_words (S-MiT word
    sampling on [K, D] texts, None = every token), wal (balanced positives/negatives),
    candidates (MIL-NCE bags of at most this many texts, own included; 0 = none)."""

    window: int | None = None
    n_frames: int | None = None
    n_words: int | None = None
    word_repeat: bool = True
    wal: bool = False
    candidates: int = 0


def collate(pairs: PairSet, idx: Sequence[int], opts: BatchOptions,
            rng: np.random.Generator) -> dict[str, torch.Tensor]:
    """A batch dict: visual [B, T, Dv] + visual_mask, text [B, K, Dt] + text_mask, index [B];
    with opts.wal the batch is doubled with one negative per pair (the pair's visual with the
    sentence of a pair of another group) and `labels` [2B] (1 positive, 0 negative); with
    opts.candidates `cand` [B, C, K, Dt] (the words of the own pair's text, then of its
    candidates'), `cand_words` [B, C, K] (real words) and `cand_mask` [B, C] (real candidates),
    so that candidates go through the text tower exactly as texts do at test time."""
    idx = [int(i) for i in idx]
    text_idx = list(idx)
    vis_idx = list(idx)
    labels = [1.0] * len(idx)
    if opts.wal:
        groups = np.asarray(pairs.groups)
        for i in idx:
            pool = np.flatnonzero(groups != groups[i])
            if len(pool) == 0:
                raise PairsError("WAL negatives need pairs from at least two groups")
            vis_idx.append(i)
            text_idx.append(int(rng.choice(pool)))
            labels.append(0.0)
    visual = []
    for i in vis_idx:
        v = pairs.visual[i]
        if v.ndim == 2 and opts.window is not None:
            v = v[sample_window(len(v), opts.window, rng)]
        if v.ndim == 2 and opts.n_frames is not None:
            v = v[sample_frames(len(v), opts.n_frames, rng)]
        visual.append(v)
    text = []
    for i in text_idx:
        t = pairs.text[i]
        if t.ndim == 2 and opts.n_words is not None:
            t = t[sample_words(len(t), opts.n_words, rng, opts.word_repeat)]
        text.append(t)
    v, vm = pad(visual)
    t, tm = pad(text)
    batch = {"visual": v, "visual_mask": vm, "text": t, "text_mask": tm,
             "index": torch.tensor(vis_idx, dtype=torch.long), "text_index": torch.tensor(text_idx, dtype=torch.long)}
    if opts.wal:
        batch["labels"] = torch.tensor(labels)
    if opts.candidates:
        batch.update(_candidate_bags(pairs, idx, opts.candidates))
    return batch


def _candidate_bags(pairs: PairSet, idx: list[int], size: int) -> dict[str, torch.Tensor]:
    bags = []
    for i in idx:
        own = [i] + list((pairs.candidates or [[]] * len(pairs))[i])
        bags.append([np.atleast_2d(pairs.text[j]) for j in own[:size]])
    n_cand = max(len(bag) for bag in bags)
    n_words = max(len(t) for bag in bags for t in bag)
    cand = np.zeros((len(bags), n_cand, n_words, pairs.text_dim), dtype=np.float32)
    words = np.zeros((len(bags), n_cand, n_words), dtype=bool)
    words[:, :, 0] = True  # an empty slot reads as one zero word: finite, and masked out below
    real = np.zeros((len(bags), n_cand), dtype=bool)
    for b, bag in enumerate(bags):
        for c, text in enumerate(bag):
            cand[b, c, : len(text)] = text
            words[b, c, : len(text)] = True
            real[b, c] = True
    return {"cand": torch.from_numpy(cand), "cand_words": torch.from_numpy(words),
            "cand_mask": torch.from_numpy(real)}


def concat_candidates(cand: torch.Tensor, words: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cat+NCE (MIL-NCE 4.3): a clip's candidate narrations as one longer narration, their words
    one after the other: cand [B, C, K, D] with words [B, C, K] and mask [B, C] -> [B, C·K, D]
    and its [B, C·K] word mask (words of padded candidates are not words)."""
    b, c, k, d = cand.shape
    return cand.reshape(b, c * k, d), (words & mask[:, :, None]).reshape(b, c * k)


def full_batches(pairs: PairSet, batch_size: int = 256) -> Iterator[dict[str, torch.Tensor]]:
    """Every pair in order, full frames and tokens (evaluation)."""
    for start in range(0, len(pairs), batch_size):
        idx = range(start, min(start + batch_size, len(pairs)))
        yield collate(pairs, idx, BatchOptions(), np.random.default_rng(0))
