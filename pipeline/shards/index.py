"""The shard index: which shards exist, what clips each holds, their size and sha256.

It is what makes shard writing incremental (clips already in a shard are not written again)
and lets readers list shards without listing a bucket. A shard is renamed into place before
the index names it, so a kill between the two only means the shard is written again, under
the same name and with the same bytes.
"""

from __future__ import annotations

import json
import posixpath
from dataclasses import asdict, dataclass, field

from pipeline.storage import Corpus

INDEX_VERSION = 1


@dataclass
class ShardEntry:
    name: str  # file name relative to the shard folder, e.g. "train-000000.tar"
    split: str
    count: int
    bytes: int
    sha256: str
    clips: list[str] = field(default_factory=list)


@dataclass
class ShardIndex:
    folder: str  # relative to the corpus root, e.g. "shards/webdataset"
    shards: list[ShardEntry] = field(default_factory=list)

    @classmethod
    def load(cls, corpus: Corpus, folder: str) -> ShardIndex:
        path = corpus.path(folder, "index.json")
        if not corpus.fs.exists(path):
            return cls(folder)
        data = json.loads(corpus.fs.cat(path))
        return cls(folder, [ShardEntry(**s) for s in data["shards"]])

    def save(self, corpus: Corpus) -> None:
        data = {"version": INDEX_VERSION, "shards": [asdict(s) for s in self.shards]}
        corpus.write_text(posixpath.join(self.folder, "index.json"),
                          json.dumps(data, indent=1, sort_keys=True) + "\n")

    def known(self, split: str) -> set[str]:
        return {c for s in self.shards if s.split == split for c in s.clips}

    def next_number(self, split: str) -> int:
        return sum(1 for s in self.shards if s.split == split)

    def add(self, entry: ShardEntry) -> None:
        self.shards = [s for s in self.shards if s.name != entry.name] + [entry]

    def count(self) -> int:
        return sum(s.count for s in self.shards)
