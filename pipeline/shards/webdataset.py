"""WebDataset tar shards: one sample per clip, key = clip_id.

Members: ``json`` (the clip row, and its score when the shards carry one), ``txt`` (its
sentence), one ``<extractor>.npy`` per feature and, when configured, ``mp4`` (the clip cut from
its video). Shards are ``{split}-{partition}-{number:06d}.tar``, written under a temporary
name and renamed when complete; tar headers carry no time or owner, so a rebuild from the same
inputs gives the same bytes.
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import Any

import numpy as np

from pipeline.ids import check_member
from pipeline.shards.hashing import HashingWriter
from pipeline.shards.index import ShardFile
from pipeline.shards.samples import Sample
from pipeline.corpus.storage import Corpus

FOLDER = "shards/webdataset"


def tar_name(split: str, partition: str, number: int) -> str:
    return f"{split}-{partition}-{number:06d}.tar"


def npy_bytes(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def encode(sample: Sample, mp4: bytes | None, score: bool = False) -> dict[str, Any]:
    """A sample's tar members; with ``score``, its JSON has a "score" field (null when the clip
    has none)."""
    clip = {**sample.clip, "score": sample.score} if score else sample.clip
    record: dict[str, Any] = {
        "__key__": clip["clip_id"],
        "json": json.dumps(clip, sort_keys=True, ensure_ascii=False).encode(),
        "txt": clip["text"].encode(),
    }
    for key, array in sorted(sample.features.items()):
        record[f"{key}.npy"] = npy_bytes(array)
    if mp4 is not None:
        record["mp4"] = mp4
    for member in record:
        if member != "__key__":
            check_member(f"{record['__key__']}.{member}")
    return record


def record_bytes(record: dict[str, Any]) -> int:
    return sum(len(v) for k, v in record.items() if not k.startswith("__"))


def write_tar(corpus: Corpus, name: str, records: list[dict[str, Any]]) -> ShardFile:
    """One tar of ``records`` (``<key>.<member>`` entries, as the webdataset library reads
    them), written under a temporary name and renamed. With the standard library's tarfile:
    the webdataset package would import torch into every shard task."""
    with corpus.atomic_file(f"{FOLDER}/{name}") as handle:
        hasher = HashingWriter(handle)
        # Not a stream ("w|"): that writes in 10 KB records, a call through the hasher each;
        # this writes a member's bytes at once, and the same bytes.
        with tarfile.open(fileobj=hasher, mode="w", format=tarfile.USTAR_FORMAT, copybufsize=1 << 20) as tar:
            for record in records:
                for member, data in record.items():
                    if member.startswith("__"):
                        continue
                    info = tarfile.TarInfo(f"{record['__key__']}.{member}")
                    info.size, info.mode, info.mtime = len(data), 0o444, 0
                    info.uname = info.gname = "vlcorpus"
                    tar.addfile(info, io.BytesIO(data))
    return ShardFile(name, hasher.bytes, hasher.sha256)
