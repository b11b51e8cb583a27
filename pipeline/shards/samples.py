"""Clips joined with their features, split by split, in a deterministic order, in chunks.

Both shard writers read the corpus through this, so WebDataset and Parquet hold the same
samples. Reads stay partitioned: one chunk of clips and its features at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.dataset as ds

from pipeline.ids import feature_key
from pipeline.storage import Corpus

CLIP_FIELDS = ("clip_id", "video_id", "start_s", "end_s", "text", "source", "policy",
               "segment_index", "candidates", "split")


@dataclass
class Sample:
    clip: dict[str, Any]
    features: dict[str, np.ndarray]  # feature key -> float16 array of its stored shape


def feature_tables(corpus: Corpus) -> dict[str, str]:
    """Feature key -> table, for every features table in the corpus."""
    return {t.split("/", 1)[1]: t for t in corpus.tables() if t.startswith("features/")}


def ordered_clips(corpus: Corpus, split: str) -> list[dict[str, Any]]:
    """Clips of one split, grouped by video and in time order: the order shards are written in."""
    table = corpus.read("clips", columns=list(CLIP_FIELDS), filter=ds.field("split") == split)
    return sorted(table.to_pylist(), key=lambda c: (c["video_id"], c["start_s"], c["clip_id"]))


def _features(corpus: Corpus, table: str, clip_ids: list[str]) -> dict[str, np.ndarray]:
    data = corpus.read(table, columns=["clip_id", "shape", "values"],
                       filter=ds.field("clip_id").isin(clip_ids))
    out = {}
    values = data.column("values")
    for i, (cid, shape) in enumerate(zip(data.column("clip_id").to_pylist(),
                                         data.column("shape").to_pylist())):
        flat = values[i].values.to_numpy(zero_copy_only=False)
        out[cid] = flat.astype(np.float16, copy=False).reshape(shape)
    return out


def samples(corpus: Corpus, clips: list[dict[str, Any]], features: list[str] | None = None,
            chunk: int = 512) -> Iterator[Sample]:
    """``clips`` with every feature they have (or only the named extractors)."""
    tables = feature_tables(corpus)
    if features is not None:
        wanted = {feature_key(f) for f in features}
        tables = {k: t for k, t in tables.items() if k in wanted}
    for i in range(0, len(clips), chunk):
        part = clips[i : i + chunk]
        ids = [c["clip_id"] for c in part]
        found = {key: _features(corpus, table, ids) for key, table in tables.items()}
        for clip in part:
            yield Sample(clip, {key: f[clip["clip_id"]] for key, f in found.items()
                                if clip["clip_id"] in f})
