"""Retrieval metrics of the five papers (papers/METHODS.md, "Metrics, defined once").

A similarity matrix is ``sim[i, j] = score(text i, video j)``, shape [N_text, N_video] (numpy
or torch). Ground truth `gt` lists, for each text, the set of its correct videos; None means
text i matches video i. "t2v" ranks the videos of each text (rows), "v2t" the texts of each
video (columns, gt inverted). A query with no correct item is left out of its direction.

Ranking is pessimistic: items are sorted by descending score and, among equal scores, the
wrong items come first, so a tie with a correct item ranks the correct item below the tie
(a constant similarity scores no better than chance-worst, never rank 1).

The low-level functions return fractions and ranks; `retrieval_metrics`, `subset_protocol`
and `multiple_choice` return percentages (R@K, mAP, accuracy) as the papers' tables do.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable, Sequence
from typing import Any, Literal

import numpy as np

Direction = Literal["t2v", "v2t"]
GroundTruth = Sequence[Collection[int]] | None
Metrics = dict[str, dict[str, float]]


def _array(sim: Any) -> np.ndarray:
    if hasattr(sim, "detach"):  # a torch tensor
        sim = sim.detach().cpu().numpy()
    out = np.asarray(sim, dtype=np.float64)
    if out.ndim != 2:
        raise ValueError(f"expected a 2-d similarity matrix, got shape {out.shape}")
    return out


def _relevance(shape: tuple[int, int], gt: GroundTruth) -> np.ndarray:
    """Boolean [N_text, N_video]: True where the video is a correct match of the text."""
    n_text, n_video = shape
    rel = np.zeros(shape, dtype=bool)
    if gt is None:
        if n_text != n_video:
            raise ValueError(f"gt=None needs a square matrix (text i matches video i), got {shape}")
        np.fill_diagonal(rel, True)
        return rel
    if len(gt) != n_text:
        raise ValueError(f"gt has {len(gt)} entries for {n_text} texts")
    for i, correct in enumerate(gt):
        for j in correct:
            if not 0 <= j < n_video:
                raise ValueError(f"gt[{i}] names video {j}, outside 0..{n_video - 1}")
            rel[i, j] = True
    return rel


def correct_ranks(sim: Any, gt: GroundTruth = None, direction: Direction = "t2v") -> list[np.ndarray]:
    """Per query with at least one correct item: the sorted 1-based pessimistic ranks of its
    correct items."""
    s = _array(sim)
    rel = _relevance(s.shape, gt)
    if direction == "v2t":
        s, rel = s.T, rel.T
    elif direction != "t2v":
        raise ValueError(f"direction must be 't2v' or 'v2t', got {direction!r}")
    # lexsort: last key is primary. Descending score, then wrong (False) before correct (True).
    order = np.lexsort((rel, -s), axis=-1)
    rel_sorted = np.take_along_axis(rel, order, axis=-1)
    return [np.flatnonzero(row) + 1 for row in rel_sorted if row.any()]


def _checked(ranks: list[np.ndarray]) -> list[np.ndarray]:
    if not ranks:
        raise ValueError("no query has a correct item")
    return ranks


def _recall(ranks: list[np.ndarray], k: int) -> float:
    return float(np.mean([r[0] <= k for r in _checked(ranks)]))


def _median_rank(ranks: list[np.ndarray]) -> float:
    return float(np.median([r[0] for r in _checked(ranks)]))


def _map(ranks: list[np.ndarray]) -> float:
    # AP = 1/m Σ_k k / r_k over the m correct items at ranks r_1 < ... < r_m (1/r_1 when m=1).
    return float(np.mean([np.mean(np.arange(1, len(r) + 1) / r) for r in _checked(ranks)]))


def recall_at(sim: Any, k: int, gt: GroundTruth = None, direction: Direction = "t2v") -> float:
    """R@K: the fraction of queries whose best-ranked correct item ranks <= k."""
    return _recall(correct_ranks(sim, gt, direction), k)


def median_rank(sim: Any, gt: GroundTruth = None, direction: Direction = "t2v") -> float:
    """medR: the median over queries of the rank (from 1) of the best-ranked correct item."""
    return _median_rank(correct_ranks(sim, gt, direction))


def mean_average_precision(sim: Any, gt: GroundTruth = None, direction: Direction = "t2v") -> float:
    """mAP: the mean over queries of average precision; the mean reciprocal rank when each
    query has one correct item."""
    return _map(correct_ranks(sim, gt, direction))


def retrieval_metrics(sim: Any, gt: GroundTruth = None, ks: Sequence[int] = (1, 5, 10)) -> Metrics:
    """{"t2v": {"R@1", "R@5", "R@10", "medR", "mAP"}, "v2t": {...}}; R@K and mAP in percent."""
    out: Metrics = {}
    for direction in ("t2v", "v2t"):
        ranks = correct_ranks(sim, gt, direction)
        row = {f"R@{k}": 100.0 * _recall(ranks, k) for k in ks}
        row["medR"] = _median_rank(ranks)
        row["mAP"] = 100.0 * _map(ranks)
        out[direction] = row
    return out


def dot(text: np.ndarray, video: np.ndarray) -> np.ndarray:
    """Dot-product similarity [N_text, N_video] of two embedding matrices."""
    return text @ video.T


def subset_protocol(source: Any, n_subsets: int = 5, size: int = 1000, seed: int = 0,
                    sim_fn: Callable[[np.ndarray, np.ndarray], np.ndarray] = dot) -> Metrics:
    """The S-MiT protocol: `retrieval_metrics` on `n_subsets` random subsets of `size` pairs,
    averaged key by key.

    source is either the full [N, N] similarity of N pairs (text i matches video i), sliced
    per subset, or a (text [N, D], video [N, D]) embedding pair, scored per subset with
    sim_fn (dot product by default), which never builds the N x N matrix. Each subset is drawn
    without replacement with numpy's default_rng(seed); subsets are independent of each other.
    """
    if isinstance(source, tuple):
        text, video = (_array(x) for x in source)
        if len(text) != len(video):
            raise ValueError(f"{len(text)} texts and {len(video)} videos: expected pairs")
        n = len(text)

        def subset_sim(idx: np.ndarray) -> np.ndarray:
            return sim_fn(text[idx], video[idx])
    else:
        full = _array(source)
        if full.shape[0] != full.shape[1]:
            raise ValueError(f"expected a square [N, N] similarity of N pairs, got {full.shape}")
        n = full.shape[0]

        def subset_sim(idx: np.ndarray) -> np.ndarray:
            return full[np.ix_(idx, idx)]
    if size > n:
        raise ValueError(f"subset size {size} is larger than the {n} pairs")
    rng = np.random.default_rng(seed)
    runs = [retrieval_metrics(subset_sim(rng.choice(n, size, replace=False))) for _ in range(n_subsets)]
    return {d: {key: float(np.mean([r[d][key] for r in runs])) for key in runs[0][d]} for d in runs[0]}


def multiple_choice(sim: Any, choices: int = 5, video_ids: Sequence[Hashable] | None = None, seed: int = 0,
                    distractors: Any = None) -> float:
    """Torabi et al.'s multiple-choice test, accuracy in percent.

    Each video j is a question: its caption j and `choices - 1` distractor captions; the
    answer is the caption it scores highest, right only when the true caption scores strictly
    above every distractor (pessimistic ties). sim is [N, N], caption i belonging to video i.
    Distractors are drawn (default_rng(seed), without replacement) from the captions of other
    source videos: video_ids[i] names pair i's source video (None: every pair its own video).
    Torabi's test also requires distractors to share no activity phrase with the true
    caption: `choice.distractors` draws such a question set, passed as `distractors`
    [N, choices - 1] caption indices.
    """
    s = _array(sim)
    n = s.shape[0]
    if s.shape[1] != n:
        raise ValueError(f"expected a square [N, N] similarity of N pairs, got {s.shape}")
    if distractors is None:
        if video_ids is None:
            ids = np.arange(n)
        else:
            if len(video_ids) != n:
                raise ValueError(f"{len(video_ids)} video ids for {n} pairs")
            codes: dict[Hashable, int] = {}
            ids = np.array([codes.setdefault(v, len(codes)) for v in video_ids], dtype=np.int64)
        rng = np.random.default_rng(seed)
        rows = []
        for j in range(n):
            pool = np.flatnonzero(ids != ids[j])
            if len(pool) < choices - 1:
                raise ValueError(f"pair {j}: {len(pool)} captions of other videos, {choices - 1} distractors needed")
            rows.append(rng.choice(pool, choices - 1, replace=False))
        picked = np.array(rows, dtype=np.int64).reshape(n, choices - 1)
    else:
        picked = np.asarray(distractors, dtype=np.int64)
        if picked.shape != (n, choices - 1) or (picked == np.arange(n)[:, None]).any():
            raise ValueError(f"distractors must be [N, choices - 1] = {(n, choices - 1)} indices of other "
                             f"captions, got shape {picked.shape}")
    true_score = s[np.arange(n), np.arange(n)]
    distractor_score = s[picked, np.arange(n)[:, None]]  # caption picked[j, c] against video j
    return 100.0 * float(np.mean(true_score > distractor_score.max(1)))
