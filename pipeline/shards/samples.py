"""Clips joined with their features, split by split, in a deterministic order, in chunks.

Both shard writers read the corpus through this, so WebDataset and Parquet hold the same
samples. Reads stay partitioned: one chunk of clips and its features at a time.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.dataset as ds
import pyarrow.parquet as pq

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


class FeatureReader:
    """Features of given clips from one features table, reading only the batch files that
    hold them: a first pass reads the ``clip_id`` column of every file, so each later lookup
    touches a few small files instead of scanning the table."""

    def __init__(self, corpus: Corpus, table: str, cache: int = 8) -> None:
        self.corpus = corpus
        self.where: dict[str, tuple[str, int]] = {}
        for path in corpus.table_files(table):
            with corpus.fs.open(path, "rb") as handle:
                ids = pq.read_table(handle, columns=["clip_id"]).column("clip_id").to_pylist()
            self.where.update((cid, (path, row)) for row, cid in enumerate(ids))
        self._files: OrderedDict[str, tuple[np.ndarray, np.ndarray, list]] = OrderedDict()
        self._cache = cache

    def _file(self, path: str) -> tuple[np.ndarray, np.ndarray, list]:
        if path not in self._files:
            with self.corpus.fs.open(path, "rb") as handle:
                data = pq.read_table(handle, columns=["shape", "values"])
            values = data.column("values").combine_chunks()
            self._files[path] = (values.values.to_numpy(zero_copy_only=False),
                                 values.offsets.to_numpy(), data.column("shape").to_pylist())
            if len(self._files) > self._cache:
                self._files.popitem(last=False)
        self._files.move_to_end(path)
        return self._files[path]

    def get(self, clip_ids: list[str]) -> dict[str, np.ndarray]:
        out = {}
        for cid in clip_ids:
            if cid in self.where:
                path, row = self.where[cid]
                flat, offsets, shapes = self._file(path)
                out[cid] = flat[offsets[row] : offsets[row + 1]].reshape(shapes[row])
        return out


def samples(corpus: Corpus, clips: list[dict[str, Any]], features: list[str] | None = None,
            chunk: int = 512) -> Iterator[Sample]:
    """``clips`` with every feature they have (or only the named extractors)."""
    tables = feature_tables(corpus)
    if features is not None:
        wanted = {feature_key(f) for f in features}
        tables = {k: t for k, t in tables.items() if k in wanted}
    readers = {key: FeatureReader(corpus, table) for key, table in tables.items()}
    for i in range(0, len(clips), chunk):
        part = clips[i : i + chunk]
        ids = [c["clip_id"] for c in part]
        found = {key: reader.get(ids) for key, reader in readers.items()}
        for clip in part:
            yield Sample(clip, {key: f[clip["clip_id"]] for key, f in found.items()
                                if clip["clip_id"] in f})
