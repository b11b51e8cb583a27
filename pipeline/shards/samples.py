"""Clips joined with their features, a batch at a time: what both shard formats are written from.

A batch's features are read from the partition's features tables with a clip-id range (which
Parquet row-group statistics narrow down: compacted tables are sorted by clip_id) and the
exact ids, so a partition's features are read about once for all its shards.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline import graph
from pipeline.corpus.storage import Corpus

CLIP_FIELDS = ("clip_id", "video_id", "start_s", "end_s", "text", "source", "policy",
               "segment_index", "candidates", "split")


@dataclass
class Sample:
    clip: dict[str, Any]
    features: dict[str, np.ndarray]  # feature key -> float16 array of its stored shape
    score: float | None = None  # the clip's score, when the shards carry one (and it has one)


def feature_tables(corpus: Corpus) -> dict[str, str]:
    """Feature key -> table, for every features table in the corpus."""
    prefix = f"{graph.FEATURES}/"
    return {t[len(prefix):]: t for t in corpus.family_tables(graph.FEATURES)}


def batch_features(corpus: Corpus, partition: str, clip_ids: list[str],
                   tables: dict[str, str]) -> dict[str, dict[str, np.ndarray]]:
    """{feature key: {clip_id: float16 array}} for the clips of a batch that have them."""
    return features_in({key: corpus.dataset(table, partition) for key, table in tables.items()}, clip_ids)


def features_in(datasets: Mapping[str, ds.Dataset], clip_ids: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """`batch_features` from features tables opened once (a reader of many batches of one
    partition lists its files once)."""
    if not clip_ids:
        return {key: {} for key in datasets}
    wanted = (ds.field("clip_id") >= min(clip_ids)) & (ds.field("clip_id") <= max(clip_ids)) \
        & ds.field("clip_id").isin(clip_ids)
    out = {}
    for key, dataset in datasets.items():
        data = dataset.to_table(columns=["clip_id", "shape", "values"], filter=wanted)
        values = data.column("values").combine_chunks()
        flat = values.values.to_numpy(zero_copy_only=False)
        offsets = values.offsets.to_numpy()
        shapes = data.column("shape").to_pylist()
        out[key] = {cid: flat[offsets[i]:offsets[i + 1]].reshape(shapes[i])
                    for i, cid in enumerate(data.column("clip_id").to_pylist())}
    return out


def batch_samples(corpus: Corpus, partition: str, clips: list[dict[str, Any]],
                  tables: dict[str, str]) -> list[Sample]:
    """``clips`` (rows with at least CLIP_FIELDS) with every feature they have."""
    found = batch_features(corpus, partition, [c["clip_id"] for c in clips], tables)
    samples = []
    for clip in clips:
        row = {name: clip.get(name) for name in CLIP_FIELDS}
        samples.append(Sample(row, {key: f[clip["clip_id"]] for key, f in found.items()
                                    if clip["clip_id"] in f}))
    return samples


def clip_count(corpus: Corpus, split: str | None = None) -> int:
    """Clips in the corpus (of one split), counted without loading them."""
    dataset = corpus.dataset("clips")
    return dataset.count_rows(filter=None if split is None else pc.field("split") == split)
