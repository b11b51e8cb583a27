"""Parquet shards: clips joined with their features (and their score, when the shards carry
one), partitioned by split (hive layout:
``shards/parquet/split=train/train-<partition>-<number>.parquet``), row groups sized for readers.
The split is in the file name too: ``datasets.load_dataset("parquet", data_dir=...)`` finds
splits by file name, not by ``split=`` folders (corpora written before are renamed by
``pipeline.shards.renames``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.shards.hashing import HashingWriter
from pipeline.shards.index import ShardFile
from pipeline.shards.samples import Sample
from pipeline.corpus.storage import Corpus
from schemas.tables import CLIPS, shard_schema

FOLDER = "shards/parquet"


def part_name(split: str, partition: str, number: int) -> str:
    return f"split={split}/{split}-{partition}-{number:06d}.parquet"


def _rows(batch: list[Sample], keys: list[str]) -> list[dict[str, Any]]:
    rows = []
    for sample in batch:
        row = {name: sample.clip.get(name) for name in CLIPS.names if name != "split"}
        row["score"] = sample.score
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
            data = pa.array(np.concatenate(flat) if flat else [], type=pa.float16())
            mask = pa.array([v is None for v in values])
            columns[field.name] = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), data,
                                                           mask=mask)
        else:
            columns[field.name] = pa.array(values, type=field.type)
    return pa.table(columns, schema=schema)


def write_part(corpus: Corpus, name: str, batch: list[Sample], keys: list[str],
               row_group_size: int, score: bool = False) -> ShardFile:
    """One part file of ``batch`` (feature columns for every key in ``keys``; with ``score``
    a ``score`` column), written under a temporary name and renamed; returns its size and
    sha256."""
    table = _table(batch, keys, shard_schema(keys, score))
    with corpus.atomic_file(f"{FOLDER}/{name}") as handle:
        hasher = HashingWriter(handle)
        pq.write_table(table, hasher, row_group_size=row_group_size, compression="zstd")
    return ShardFile(name, hasher.bytes, hasher.sha256)
