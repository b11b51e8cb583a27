"""What the report shows of the score tables (``scores/<model>``): the distribution of the
scores and the clips at both ends, read partition by partition (columns only, then the texts of
the few example clips), so memory follows a partition and the number of examples.

    from pipeline.report.scores import score_summary
    score_summary(corpus)  # {"scores/wal": {...}} for every score table of the corpus; see below
"""

from __future__ import annotations

import heapq
import math
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline import graph
from pipeline.corpus import partitions
from pipeline.corpus.storage import Corpus

VALUES = ("similarity", "p_aligned")


def _edges(low: float, high: float, bins: int) -> np.ndarray:
    return np.linspace(low, high, bins + 1) if high > low else np.array([low - 0.5, high + 0.5])


def _histograms(corpus: Corpus, table: str, labels: list[str], name: str, edges: list[np.ndarray]) -> list[dict]:
    """Histograms of one column over `edges` each, a partition at a time."""
    counts = [np.zeros(len(e) - 1, dtype=np.int64) for e in edges]
    for label in labels:
        values = corpus.read(table, columns=[name], partition=label).column(name).drop_null().to_numpy()
        for c, e in zip(counts, edges):
            c += np.histogram(values, bins=e)[0]
    return [{"edges": [float(x) for x in e], "counts": [int(x) for x in c]} for e, c in zip(edges, counts)]


def _quantile(histogram: dict[str, list], q: float) -> float:
    """The q-quantile read off a histogram (linear within the bin it falls in)."""
    counts = np.asarray(histogram["counts"], dtype=np.float64)
    edges = np.asarray(histogram["edges"])
    target = q * counts.sum()
    cumulative = np.cumsum(counts)
    i = int(np.searchsorted(cumulative, target))
    i = min(i, len(counts) - 1)
    before = cumulative[i - 1] if i else 0.0
    inside = (target - before) / counts[i] if counts[i] else 0.0
    return float(edges[i] + inside * (edges[i + 1] - edges[i]))


def table_summary(corpus: Corpus, table: str, bins: int = 20, examples: int = 5) -> dict[str, Any]:
    """One score table: see `score_summary`."""
    labels = corpus.partitions_of(table)
    columns = ["clip_id", "similarity", "rank", "sentences", "p_aligned", "model", "checkpoint"]
    per_partition: dict[str, dict[str, Any]] = {}
    ranges = {name: [math.inf, -math.inf] for name in VALUES}
    ranks: dict[int, int] = {}
    models, checkpoints, sums = set(), set(), {name: 0.0 for name in VALUES}
    counts = {name: 0 for name in VALUES}
    top: list[tuple[float, str]] = []  # min-heap of the best `examples` (similarity, clip_id)
    bottom: list[tuple[float, str]] = []  # min-heap of (-similarity, clip_id): the worst
    for label in labels:
        data = corpus.read(table, columns=columns, partition=label)
        if not data.num_rows:
            continue
        models |= set(pc.unique(data.column("model")).to_pylist())
        checkpoints |= set(pc.unique(data.column("checkpoint")).to_pylist())
        row: dict[str, Any] = {"clips": data.num_rows}
        for name in VALUES:
            values = data.column(name).drop_null().to_numpy().astype(np.float64)
            if not len(values):
                continue
            ranges[name] = [min(ranges[name][0], float(values.min())), max(ranges[name][1], float(values.max()))]
            sums[name] += float(values.sum())
            counts[name] += len(values)
            row[f"{name}_mean"] = float(values.mean())
        row["rank_1_share"] = float(pc.mean(pc.equal(data.column("rank"), 1).cast("float64")).as_py())
        per_partition[label] = row
        for entry in pc.value_counts(data.column("rank")).to_pylist():
            ranks[entry["values"]] = ranks.get(entry["values"], 0) + entry["counts"]
        ids = data.column("clip_id").to_pylist()
        sims = data.column("similarity").to_pylist()
        for sim, cid in zip(sims, ids):
            for heap, key in ((top, sim), (bottom, -sim)):
                if len(heap) < examples:
                    heapq.heappush(heap, (key, cid))
                elif key > heap[0][0]:
                    heapq.heapreplace(heap, (key, cid))
    out: dict[str, Any] = {"table": table, "models": sorted(models), "checkpoints": sorted(checkpoints),
                           "clips": sum(p["clips"] for p in per_partition.values())}
    for name in VALUES:
        if not counts[name]:
            out[name] = None
            continue
        low, high = ranges[name]  # a second pass, now that the range is known
        histogram, fine = _histograms(corpus, table, list(per_partition), name,
                                      [_edges(low, high, bins), _edges(low, high, 1000)])
        out[name] = {"n": counts[name], "min": low, "max": high, "mean": sums[name] / counts[name],
                     "quantiles": {q: _quantile(fine, float(q)) for q in ("0.1", "0.5", "0.9")},
                     "histogram": histogram}
    out["rank"] = {str(k): v for k, v in sorted(ranks.items())}
    out["partitions"] = per_partition
    out["top"] = _examples(corpus, table, [cid for _, cid in sorted(top, reverse=True)])
    out["bottom"] = _examples(corpus, table, [cid for _, cid in sorted(bottom, reverse=True)])
    return out


def _examples(corpus: Corpus, table: str, clip_ids: list[str]) -> list[dict[str, Any]]:
    """The example clips with their sentence, video, split and scores, in the given order."""
    rows: dict[str, dict[str, Any]] = {}
    by_partition: dict[str, list[str]] = {}
    for cid in clip_ids:
        by_partition.setdefault(corpus.partition_of(partitions.video_of_clip(cid)), []).append(cid)
    for label, ids in by_partition.items():
        wanted = ds.field("clip_id").isin(ids)
        clips = {c["clip_id"]: c for c in corpus.read("clips", columns=["clip_id", "video_id", "text", "split",
                                                                      "start_s", "end_s"],
                                                      filter=wanted, partition=label).to_pylist()}
        for score in corpus.read(table, columns=["clip_id", "similarity", "rank", "sentences", "p_aligned"],
                                 filter=wanted, partition=label).to_pylist():
            rows[score["clip_id"]] = {**clips.get(score["clip_id"], {"clip_id": score["clip_id"]}), **score}
    return [rows[c] for c in clip_ids if c in rows]


def score_summary(corpus: Corpus, bins: int = 20, examples: int = 5) -> dict[str, dict[str, Any]]:
    """For each score table of the corpus, ``{"scores/<model>": summary}`` where summary is:

    - ``table``, ``models`` (the score models in it), ``checkpoints`` (the weights file ids), ``clips``;
    - ``similarity`` and ``p_aligned`` (None when no row has one): ``n``, ``min``, ``max``,
      ``mean``, ``quantiles`` {"0.1", "0.5", "0.9"} (read off a 1000-bin histogram),
      ``histogram`` {"edges": bins + 1 floats, "counts": bins ints};
    - ``rank``: {"1": clips whose sentence ranks first in their video, "2": ..., ...};
    - ``partitions``: {label: {"clips", "similarity_mean", "p_aligned_mean", "rank_1_share"}};
    - ``top`` and ``bottom``: the `examples` clips of highest and lowest similarity, best first
      and worst first: {"clip_id", "video_id", "text", "split", "start_s", "end_s",
      "similarity", "rank", "sentences", "p_aligned"}.

    Empty when the corpus has no score table."""
    return {table: table_summary(corpus, table, bins, examples) for table in corpus.family_tables(graph.SCORES)}
