"""Training pairs streamed from a corpus's tables in bounded memory (HowTo100M-sized corpora).

A pass visits the partitions (in a seeded order when shuffling); a partition's clips, read with
the needed columns only, are cut into chunks of whole videos in clip_id order, and each chunk is
joined with its features (`features_in`: a clip_id range read, so sorted files are read row
group by row group). Training pours the chunks, in seeded order, into a shuffle buffer of
bounded size and draws each batch from it (one pair per video where the buffer allows), as
webdataset shuffles. Held-out pairs (val, test) are a seeded reservoir sample of bounded size,
scored in memory as a `PairSet`. Memory: one chunk and the buffer, whatever the corpus size.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.config import StreamConfig
from pipeline.ids import feature_key
from pipeline.shards.samples import features_in
from pipeline.corpus.storage import Corpus
from pipeline.train.pairs import SPLITS, PairSet, PairsError, concat_visual

CLIP_COLUMNS = ["clip_id", "video_id", "text", "split", "candidates"]


@dataclass
class Pair:
    """One pair in the buffer, with the texts of its MIL-NCE candidates (they travel with it)."""

    pair_id: str
    group: str
    split: str
    visual: np.ndarray
    text: np.ndarray
    caption: str
    candidates: list[np.ndarray]


class PairStream:
    """The pairs of a corpus (clips joined with the features of `visual` and `text`), read
    chunk by chunk; `test_ids`, when given, are the only test pairs (align.test_clip_ids)."""

    def __init__(self, corpus: Corpus, visual: str | Sequence[str], text: str, options: StreamConfig,
                 test_ids: frozenset[str] | None = None) -> None:
        self.corpus = corpus
        self.options = options
        # Only the listed clips of the test split are test pairs; an Arrow array, as the filter takes it.
        self.test_ids = None if test_ids is None else pa.array(sorted(test_ids), pa.string())
        self.meta = {"source": corpus.url, "visual": visual, "text": text, "streamed": True}
        names = [visual] if isinstance(visual, str) else list(visual)
        roles = [(f"visual{i}", "visual", n) for i, n in enumerate(names)] + [("text", "text", text)]
        self.tables = {key: f"features/{feature_key(name)}" for key, _, name in roles}
        for key, role, name in roles:
            if corpus.dataset(self.tables[key]).count_rows() == 0:
                raise PairsError(f"{corpus.url}: {self.tables[key]} ({role} extractor {name!r}) has no rows; "
                                 f"tables present: {', '.join(corpus.tables()) or '(none)'}")
        self.counts: dict[str, int] = {}  # pairs per split, as the last full pass over it found

    def clip_count(self, split: str) -> int:
        """Clips of one split (with or without features), from the clips table's split column."""
        return self.corpus.dataset("clips").count_rows(filter=ds.field("split") == split)

    def chunks(self, splits: Sequence[str], rng: np.random.Generator | None = None) -> Iterator[PairSet]:
        """Every pair of `splits`, a chunk of whole videos at a time: partitions and chunks in
        order, or shuffled by `rng`. The next chunk is read in a thread while this one is used
        (Arrow decodes without the GIL); the order is the same as without it."""
        counts = dict.fromkeys(splits, 0)
        with ThreadPoolExecutor(1) as reader:
            ahead: Future[PairSet] | None = None
            for tables, clips in self._spans(splits, rng):
                job = reader.submit(self._join, tables, clips)
                if ahead is not None:
                    yield self._counted(ahead.result(), counts)
                ahead = job
            if ahead is not None:
                yield self._counted(ahead.result(), counts)
        self.counts.update(counts)

    def _spans(self, splits: Sequence[str], rng: np.random.Generator | None) -> Iterator[tuple[dict, pa.Table]]:
        """(a partition's features tables, a chunk of its clips), in the order of `chunks`."""
        labels = self.corpus.partitions_of("clips")
        order = rng.permutation(len(labels)) if rng is not None else range(len(labels))
        for p in order:
            clips = self._clips(labels[p], splits)
            tables = {role: self.corpus.dataset(table, labels[p]) for role, table in self.tables.items()}
            bounds = _video_chunks(clips.column("video_id"), self.options.chunk)
            spans = rng.permutation(len(bounds)) if rng is not None else range(len(bounds))
            for s in spans:
                start, stop = bounds[s]
                yield tables, clips.slice(start, stop - start)

    @staticmethod
    def _counted(chunk: PairSet, counts: dict[str, int]) -> PairSet:
        for split in chunk.splits:
            counts[split] += 1
        return chunk

    def _clips(self, partition: str, splits: Sequence[str]) -> pa.Table:
        wanted = ds.field("split").isin(list(splits))
        clips = self.corpus.read("clips", columns=CLIP_COLUMNS, filter=wanted, partition=partition)
        if self.test_ids is not None and "test" in splits:
            keep = pc.or_(pc.not_equal(clips.column("split"), "test"),
                          pc.is_in(clips.column("clip_id"), self.test_ids))
            clips = clips.filter(keep)
        return clips.sort_by("clip_id")

    def _join(self, tables: dict[str, ds.Dataset], clips: pa.Table) -> PairSet:
        rows = clips.to_pylist()
        feats = features_in(tables, [r["clip_id"] for r in rows])
        visual = concat_visual([feats[role] for role in self.tables if role != "text"])
        return PairSet._from_clips(rows, visual, feats["text"], self.meta)

    def batches(self, split: str, batch_size: int, rng: np.random.Generator,
                min_batch: int = 2) -> Iterator[tuple[PairSet, list[int]]]:
        """Shuffled batches of one split for `collate`: (a batch's pairs, its indices); the
        pairs after the indices are candidate texts, which only `candidates` points at."""
        buffer: list[Pair] = []
        for chunk in self.chunks([split], rng):
            buffer += _pairs_of(chunk)
            while len(buffer) >= max(self.options.buffer, batch_size):
                yield _as_batch(_draw(buffer, batch_size, rng))
        while len(buffer) >= min_batch:
            yield _as_batch(_draw(buffer, batch_size, rng))

    def sample(self, splits: Sequence[str], size: int, seed: int) -> PairSet:
        """At most `size` pairs of each split, a seeded reservoir sample, in pair_id order."""
        # One generator per split: a split's sample is the same whichever splits are sampled with it.
        rngs = {s: np.random.default_rng([seed, 4, SPLITS.index(s)]) for s in splits}
        kept: dict[str, list[Pair]] = {s: [] for s in splits}
        seen = dict.fromkeys(splits, 0)
        for chunk in self.chunks(splits):
            for pair in _pairs_of(chunk):
                seen[pair.split] += 1
                slot = kept[pair.split]
                if len(slot) < size:
                    slot.append(pair)
                else:
                    j = int(rngs[pair.split].integers(seen[pair.split]))
                    if j < size:
                        slot[j] = pair
        pairs = sorted((p for slot in kept.values() for p in slot), key=lambda p: p.pair_id)
        return PairSet([p.pair_id for p in pairs], [p.group for p in pairs], [p.split for p in pairs],
                       [p.visual for p in pairs], [p.text for p in pairs],
                       meta={**self.meta, "sampled": size}, captions=[p.caption for p in pairs])


def _video_chunks(videos: pa.ChunkedArray, size: int) -> list[tuple[int, int]]:
    """[start, stop) row spans of about `size` rows that cut only between videos."""
    v = videos.to_numpy(zero_copy_only=False)
    if len(v) == 0:
        return []
    cuts = np.flatnonzero(v[1:] != v[:-1]) + 1  # first row of each video but the first
    spans, start = [], 0
    for cut in cuts:
        if cut - start >= size:
            spans.append((start, int(cut)))
            start = int(cut)
    spans.append((start, len(v)))
    return spans


def _pairs_of(chunk: PairSet) -> list[Pair]:
    cands = chunk.candidates or [[]] * len(chunk)
    return [Pair(chunk.pair_ids[i], chunk.groups[i], chunk.splits[i], chunk.visual[i], chunk.text[i],
                 (chunk.captions or chunk.pair_ids)[i], [chunk.text[j] for j in cands[i]])
            for i in range(len(chunk))]


def _draw(buffer: list[Pair], size: int, rng: np.random.Generator) -> list[Pair]:
    """Take `size` random pairs out of the buffer, one per video where it has enough videos."""
    order = rng.permutation(len(buffer))
    taken, groups = [], set()
    for i in order:
        if buffer[i].group not in groups:
            taken.append(int(i))
            groups.add(buffer[i].group)
            if len(taken) == size:
                break
    if len(taken) < size:  # too few videos in the buffer: repeat some
        chosen = set(taken)
        taken += [int(i) for i in order if int(i) not in chosen][: size - len(taken)]
    batch = [buffer[i] for i in taken]
    for i in sorted(taken, reverse=True):  # swap-remove keeps removal O(1) per pair
        buffer[i] = buffer[-1]
        buffer.pop()
    return batch


def _as_batch(batch: list[Pair]) -> tuple[PairSet, list[int]]:
    """The batch as a `PairSet` whose first len(batch) pairs are the batch and whose others are
    its candidate texts (with their owner's visual), so `collate` builds the candidate bags."""
    extra: list[tuple[Pair, np.ndarray]] = [(p, t) for p in batch for t in p.candidates]
    cands, at = [], len(batch)
    for p in batch:
        cands.append(list(range(at, at + len(p.candidates))))
        at += len(p.candidates)
    owners = list(batch) + [p for p, _ in extra]
    pairs = PairSet([p.pair_id for p in owners], [p.group for p in owners], [p.split for p in owners],
                    [p.visual for p in owners], [p.text for p in batch] + [t for _, t in extra],
                    cands + [[] for _ in extra], captions=[p.caption for p in owners])
    return pairs, list(range(len(batch)))
