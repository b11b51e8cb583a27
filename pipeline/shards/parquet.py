"""Parquet shards: clips joined with their features, partitioned by split (hive layout:
``shards/parquet/split=train/part-000000.parquet``), row groups sized for readers.

Incremental like the WebDataset shards: new clips go to new part files, named in order.
"""

from __future__ import annotations

import posixpath
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import Config
from pipeline.progress import track
from pipeline.shards.hashing import HashingWriter
from pipeline.shards.index import ShardEntry, ShardIndex
from pipeline.shards.samples import Sample, feature_tables, ordered_clips, samples
from pipeline.storage import TMP_PREFIX, Corpus
from schemas.tables import CLIPS, shard_schema

FOLDER = "shards/parquet"
SPLITS = ("train", "val", "test")


def _rows(batch: list[Sample], keys: list[str]) -> list[dict[str, Any]]:
    rows = []
    for sample in batch:
        row = {name: sample.clip.get(name) for name in CLIPS.names if name != "split"}
        for key in keys:
            array = sample.features.get(key)
            row[key] = None if array is None else array.reshape(-1)
            row[f"{key}_shape"] = None if array is None else list(array.shape)
        rows.append(row)
    return rows


def _table(batch: list[Sample], keys: list[str], schema: pa.Schema) -> pa.Table:
    rows = _rows(batch, keys)
    columns = {}
    for field in schema:
        values = [r[field.name] for r in rows]
        if field.name in keys:
            # Build float16 lists from numpy without a Python-float round trip.
            offsets = [0]
            for v in values:
                offsets.append(offsets[-1] + (0 if v is None else len(v)))
            flat = [v for v in values if v is not None]
            data = pa.array(np.concatenate(flat) if flat else [],
                            type=pa.float16())
            mask = pa.array([v is None for v in values])
            columns[field.name] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), data,
                                                           mask=mask)
        else:
            columns[field.name] = pa.array(values, type=field.type)
    return pa.table(columns, schema=schema)


def _write_part(corpus: Corpus, index: ShardIndex, split: str, batch: list[Sample],
                keys: list[str], schema: pa.Schema, cfg: Config) -> None:
    name = f"split={split}/part-{index.next_number(split):06d}.parquet"
    folder = corpus.path(FOLDER, f"split={split}")
    corpus.fs.makedirs(folder, exist_ok=True)
    tmp = posixpath.join(folder, f"{TMP_PREFIX}{uuid.uuid4().hex}.parquet")
    table = _table(batch, keys, schema)
    with corpus.fs.open(tmp, "wb") as handle:
        hasher = HashingWriter(handle)
        pq.write_table(table, hasher, row_group_size=cfg.shards.parquet.row_group_size,
                       compression="zstd")
    corpus.fs.mv(tmp, corpus.path(FOLDER, name))
    index.add(ShardEntry(name, split, len(batch), hasher.bytes, hasher.sha256,
                         [s.clip["clip_id"] for s in batch]))
    index.save(corpus)


def write_parquet(corpus: Corpus, cfg: Config) -> dict[str, Any]:
    """Write part files for every clip not yet in one; returns counts per split."""
    for split in SPLITS:
        corpus.sweep_temporary(f"{FOLDER}/split={split}")
    index = ShardIndex.load(corpus, FOLDER)
    keys = sorted(feature_tables(corpus))
    schema = shard_schema(keys)
    written: dict[str, int] = {}
    per_file = cfg.shards.parquet.rows_per_file
    for split in SPLITS:
        known = index.known(split)
        clips = [c for c in ordered_clips(corpus, split) if c["clip_id"] not in known]
        batch: list[Sample] = []
        for sample in track(samples(corpus, clips), f"parquet {split}", total=len(clips)):
            batch.append(sample)
            if len(batch) >= per_file:
                _write_part(corpus, index, split, batch, keys, schema, cfg)
                batch = []
        if batch:
            _write_part(corpus, index, split, batch, keys, schema, cfg)
        written[split] = len(clips)
    return {"written": {k: v for k, v in written.items() if v}, "files": len(index.shards),
            "samples": index.count()}
