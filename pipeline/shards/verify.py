"""Shards against their partition index, for ``vlcorpus validate``: each file the index lists
is there, has the recorded size and (unless quick) the recorded sha256. A damaged shard is
taken out of its partition index, so its clips count as not sharded (``vlcorpus status``) and
the next build writes the shard again, under the same name."""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pyarrow as pa

from pipeline.shards.index import ROOT, PartitionIndex, ShardEntry, ShardFile, index_path
from pipeline.corpus.storage import Corpus

_CHUNK = 4 << 20
_READERS = 8  # indexes read, shards hashed at once: an object store answers each read slowly, not a disk


@dataclass(frozen=True)
class Damage:
    partition: str
    split: str
    number: int  # -1: the partition index itself is unreadable
    file: str  # relative to the corpus root, e.g. "shards/webdataset/train-00003-000000.tar"
    problem: str

    def __str__(self) -> str:
        return f"{self.file}: {self.problem}"


def _problem(corpus: Corpus, path: str, recorded: ShardFile, hashes: bool) -> str | None:
    try:
        size = corpus.fs.size(path)
    except FileNotFoundError:
        return "missing"
    if size != recorded.bytes:
        return f"{size} bytes, the shard index recorded {recorded.bytes} (truncated or rewritten)"
    if not hashes:
        return None
    sha = hashlib.sha256()
    # Blocks of one chunk: s3fs would read 50 MB ahead of each chunk, for each shard in flight.
    with corpus.fs.open(path, "rb", block_size=_CHUNK) as handle:
        while chunk := handle.read(_CHUNK):
            sha.update(chunk)
    if sha.hexdigest() != recorded.sha256:
        return "its sha256 differs from the shard index's (altered)"
    return None


def _shards(corpus: Corpus, partition: str) -> list[ShardEntry] | Damage:
    """The shards a partition's index lists (its clip list is not kept), or its damage."""
    try:
        return PartitionIndex.load(corpus, partition).shards
    except (pa.ArrowInvalid, OSError, KeyError, ValueError) as exc:
        return Damage(partition, "", -1, index_path(partition), f"unreadable shard index ({exc})")


def check_shards(corpus: Corpus, partitions: Iterable[str], hashes: bool = True) -> list[Damage]:
    """The damaged shard files of ``partitions``, in partition and name order (the unreadable
    indexes first); indexes are read, and shards checked, ``_READERS`` at a time."""
    labels = list(partitions)
    with ThreadPoolExecutor(_READERS) as pool:
        listed = list(pool.map(lambda p: _shards(corpus, p), labels))
        unreadable = [d for d in listed if isinstance(d, Damage)]
        checks = [(partition, entry, posixpath.join(ROOT, fmt, recorded.name), recorded)
                  for partition, shards in zip(labels, listed) if not isinstance(shards, Damage)
                  for entry in shards for fmt, recorded in entry.files.items()]
        found = pool.map(lambda c: _problem(corpus, corpus.path(c[2]), c[3], hashes), checks)
        return unreadable + [Damage(partition, entry.split, entry.number, file, problem)
                             for (partition, entry, file, _), problem in zip(checks, found) if problem]


def take_out(corpus: Corpus, damage: list[Damage]) -> None:
    """Take the damaged shards (both formats: they hold the same clips) out of their partition
    indexes; the next build writes them again."""
    by_partition: dict[str, set[tuple[str, int]]] = {}
    for d in damage:
        if d.number < 0:  # the index itself: nothing in it to take out
            continue
        by_partition.setdefault(d.partition, set()).add((d.split, d.number))
    for partition, shards in by_partition.items():
        index = PartitionIndex.load(corpus, partition)
        index.remove([s for s in index.shards if (s.split, s.number) in shards])
        index.save(corpus)
