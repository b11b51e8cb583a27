"""Which shards exist and what clips each holds.

Per partition, ``shards/_index/p<partition>.parquet``: one row per clip the shard stage settled
(clip_id, split, shard number; shard -1 when the score filter left the clip out), with the
partition's shard listing (names, counts, bytes, sha256 of both formats) in its footer. It is
rewritten, whole and atomically, after each batch's shards are renamed into place, so a kill in
between only means the batch is written again, under the same names and with the same bytes.
Its clip ids are the shard stage's done keys.

Per format, ``shards/<format>/index.json`` lists every shard of the corpus (no clip lists),
so readers find shards without listing a bucket. A partition's index is saved only after an
empty marker, ``shards/_index/unlisted/p<partition>``, says that the listings lack its change;
the refresh after a run's shard tasks reads the marked partitions' indexes and removes their
markers once the listings are written, so a build killed between a partition's shards and the
listings lists them on its next run.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.corpus.storage import Corpus

INDEX_VERSION = 2
ROOT = "shards"
INDEX_DIR = f"{ROOT}/_index"
UNLISTED_DIR = f"{INDEX_DIR}/unlisted"
FORMATS = ("webdataset", "parquet")
LISTING_KEY = b"vlcorpus.shards"
DROPPED = -1  # the shard number of a clip the score filter left out
_SCHEMA = pa.schema([pa.field("clip_id", pa.string(), nullable=False),
                     pa.field("split", pa.string(), nullable=False),
                     pa.field("shard", pa.int32(), nullable=False)])


@dataclass
class ShardFile:
    name: str  # relative to the format's folder, e.g. "train-00003-000000.tar"
    bytes: int
    sha256: str


@dataclass
class ShardEntry:
    number: int
    split: str
    count: int
    files: dict[str, ShardFile] = field(default_factory=dict)  # format -> its file


def index_path(partition: str) -> str:
    return f"{INDEX_DIR}/p{partition}.parquet"


@dataclass
class PartitionIndex:
    partition: str
    clips: pa.Table = field(default_factory=_SCHEMA.empty_table)
    shards: list[ShardEntry] = field(default_factory=list)

    @classmethod
    def load(cls, corpus: Corpus, partition: str) -> PartitionIndex:
        path = corpus.path(index_path(partition))
        if not corpus.fs.exists(path):
            return cls(partition)
        with corpus.fs.open(path, "rb") as handle:
            data = pq.read_table(handle)
        listing = json.loads((data.schema.metadata or {})[LISTING_KEY])
        shards = [ShardEntry(s["number"], s["split"], s["count"],
                             {k: ShardFile(**f) for k, f in s["files"].items()})
                  for s in listing["shards"]]
        return cls(partition, data.replace_schema_metadata(None).cast(_SCHEMA), shards)

    def free_numbers(self, split: str) -> Iterator[int]:
        """The numbers no shard of ``split`` has, ascending: a shard taken out (damaged) leaves
        a gap that the next shard fills, under its old name."""
        used = {s.number for s in self.shards if s.split == split}
        return (n for n in itertools.count() if n not in used)

    def add(self, entry: ShardEntry, clips: list[str]) -> None:
        self.shards = [s for s in self.shards if (s.split, s.number) != (entry.split, entry.number)]
        self.shards.append(entry)
        rows = pa.table({"clip_id": clips, "split": [entry.split] * len(clips),
                         "shard": [entry.number] * len(clips)}, schema=_SCHEMA)
        self.clips = pa.concat_tables([self.clips, rows])

    def remove(self, entries: list[ShardEntry]) -> None:
        """Take shards out, with their clips: those clips are no longer done."""
        gone = {(e.split, e.number) for e in entries}
        self.shards = [s for s in self.shards if (s.split, s.number) not in gone]
        out = pa.array([False] * self.clips.num_rows, pa.bool_())
        for split, number in gone:
            out = pc.or_(out, pc.and_(pc.equal(self.clips.column("split"), split),
                                      pc.equal(self.clips.column("shard"), number)))
        self.clips = self.clips.filter(pc.invert(out))

    def drop(self, clips: list[str], split: str) -> None:
        """Clips the score filter leaves out: done, in no shard (shard number -1)."""
        rows = pa.table({"clip_id": clips, "split": [split] * len(clips), "shard": [DROPPED] * len(clips)},
                        schema=_SCHEMA)
        self.clips = pa.concat_tables([self.clips, rows])

    def save(self, corpus: Corpus) -> None:
        listing = {"version": INDEX_VERSION, "partition": self.partition,
                   "shards": [asdict(s) for s in sorted(self.shards, key=lambda s: (s.split, s.number))]}
        data = self.clips.replace_schema_metadata({LISTING_KEY: json.dumps(listing)})
        corpus.write_text(f"{UNLISTED_DIR}/p{self.partition}", "")
        corpus.write_table(index_path(self.partition), data)


def listing_path(fmt: str) -> str:
    return f"{ROOT}/{fmt}/index.json"


def load_listing(corpus: Corpus, fmt: str) -> list[dict]:
    return (corpus.read_json(listing_path(fmt)) or {}).get("shards", [])


def refresh_listings(corpus: Corpus) -> dict[str, list[dict]]:
    """Bring each format's index.json up to date with the partitions marked unlisted; returns
    the listings."""
    changed = _unlisted(corpus)
    listings = {}
    for fmt in FORMATS:
        entries = [e for e in load_listing(corpus, fmt) if e["partition"] not in changed]
        for partition in changed:
            for shard in PartitionIndex.load(corpus, partition).shards:
                if fmt in shard.files:
                    entries.append({**asdict(shard.files[fmt]), "split": shard.split,
                                    "count": shard.count, "partition": partition})
        entries.sort(key=lambda e: e["name"])
        if entries or corpus.fs.exists(corpus.path(listing_path(fmt))):
            corpus.write_text(listing_path(fmt), json.dumps(
                {"version": INDEX_VERSION, "shards": entries}, indent=1, sort_keys=True) + "\n")
        listings[fmt] = entries
    for partition in changed:
        corpus.fs.rm(corpus.path(f"{UNLISTED_DIR}/p{partition}"))
    return listings


def _unlisted(corpus: Corpus) -> list[str]:
    """The partitions whose index changed after the listings were last written."""
    folder = corpus.path(UNLISTED_DIR)
    if not corpus.fs.exists(folder):
        return []
    return sorted(name.rsplit("/", 1)[-1][1:] for name in corpus.fs.ls(folder, detail=False))
