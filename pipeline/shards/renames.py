"""Parquet shards of older corpora renamed to carry their split in the file name
(``split=train/part-00003-000000.parquet`` becomes ``split=train/train-00003-000000.parquet``).

``datasets.load_dataset("parquet", data_dir=...)`` finds splits by a split word in the file
names and does not read ``split=`` folders: without one it reads every file of the folder, the
listing ``index.json`` included, as a single "train" split. A build renames the shards of an
older corpus once, after its listings; a rename keeps the bytes, so the recorded size and
sha256 still hold.
"""

from __future__ import annotations

import re

from pipeline.shards.index import ROOT, PartitionIndex
from pipeline.corpus.storage import Corpus

_OLD = re.compile(r"^split=(?P<split>[^/]+)/part-(?P<rest>[^/]+\.parquet)$")


def new_name(name: str) -> str | None:
    """The current name of a Parquet shard named the old way, None for any other name."""
    found = _OLD.match(name)
    return f"split={found['split']}/{found['split']}-{found['rest']}" if found else None


def rename_old_parts(corpus: Corpus, entries: list[dict]) -> list[str]:
    """Rename the old-named Parquet shards of the partitions that ``entries`` (the Parquet
    listing) shows with one, file then partition index; returns those partitions, whose
    listings are then stale. A kill in between leaves an index naming old files that are gone:
    the next build finds the new files and records their names."""
    partitions = sorted({e["partition"] for e in entries if new_name(e["name"])})
    for partition in partitions:
        index = PartitionIndex.load(corpus, partition)
        for entry in index.shards:
            shard = entry.files.get("parquet")
            renamed = new_name(shard.name) if shard else None
            if shard is None or renamed is None:
                continue
            old = corpus.path(ROOT, "parquet", shard.name)
            if corpus.fs.exists(old):
                corpus.fs.mv(old, corpus.path(ROOT, "parquet", renamed))
            shard.name = renamed
        index.save(corpus)
    return partitions
