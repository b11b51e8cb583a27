"""The shard stage: per partition, its clips with their features (and clip media) into
WebDataset and Parquet shards, both from one read.

A batch is one shard of each enabled format (``shards.samples_per_shard`` clips of one split, fewer
when ``max_bytes`` is reached first, then the next shard): shard N of a split holds the same
clips in both formats. A clip whose media cannot be cut is an errors row (bad input, so it is
not cut again on every run) and is in neither format. New clips go to new shards; shards
already written are never rewritten.

With a ``score`` section the shards carry each clip's score (``shards.score_by`` of
``scores/<model>``: a ``score`` column, a "score" field of the JSON), and a video's clips wait
until every one of them is scored or failed to be (so a filter per video sees the whole video).
``shards.min_score`` and ``shards.score_top_fraction`` then leave clips out of both formats
(of the splits in ``shards.score_splits``): such a clip is done, in the partition index with
shard -1 and counted by reason in the stage's counters, not an error.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline import graph
from pipeline.config import Config
from pipeline.errors import BadInputError
from pipeline.featurize.stage import clips_with_media
from pipeline.media import ClipCut, cut_videos
from pipeline.runner import Item, Outcome, Stage, StageContext, final_errors, run_partition
from pipeline.setup import require_binaries
from pipeline.shards.card import write_cards
from pipeline.shards.index import PartitionIndex, ShardEntry, refresh_listings
from pipeline.shards.parquet import part_name, write_part
from pipeline.shards.renames import rename_old_parts
from pipeline.shards.samples import Sample, batch_samples, feature_tables
from pipeline.shards.webdataset import encode, record_bytes, tar_name, write_tar
from pipeline.corpus.storage import Corpus


def _cut_media(corpus: Corpus, cfg: Config, items: Sequence[Item],
               workdir: str) -> dict[str, str | BadInputError]:
    """Each clip's mp4, the batch's videos cut side by side (``media.processes`` at once; a
    remote root's videos of the batch are copied to local files meanwhile)."""
    mcfg = cfg.shards.webdataset.media
    by_video: dict[str | None, list[Item]] = {}
    for item in items:
        by_video.setdefault(item.info.get("media_path"), []).append(item)
    out: dict[str, str | BadInputError] = {}
    with ExitStack() as stack:
        videos = []
        for media, group in by_video.items():
            if not media:
                out |= {i.key: BadInputError(f"no media for {i.rows[0]['video_id']}") for i in group}
                continue
            videos.append((stack.enter_context(corpus.local_file(media)),
                           [ClipCut(i.key, i.rows[0]["start_s"], i.rows[0]["end_s"],
                                    os.path.join(workdir, f"{i.key}.mp4")) for i in group]))
        out |= cut_videos(videos, precision=mcfg.precision, height=mcfg.height, fps=mcfg.fps,
                          codec=mcfg.codec, audio=mcfg.audio, processes=mcfg.processes)
    return out


def _write(corpus: Corpus, cfg: Config, partition: str, split: str, number: int,
           samples: list[Sample], records: list[dict[str, Any]], keys: list[str]) -> ShardEntry:
    entry = ShardEntry(number, split, len(samples))
    if cfg.shards.webdataset.enabled:
        entry.files["webdataset"] = write_tar(corpus, tar_name(split, partition, number), records)
    if cfg.shards.parquet.enabled:
        entry.files["parquet"] = write_part(corpus, part_name(split, partition, number), samples,
                                            keys, cfg.shards.parquet.row_group_size, cfg.score is not None)
    return entry


def _inputs(ctx: StageContext, partition: str, keys: pa.Array) -> pa.Table:
    """Clips with their media path; with a score section only the clips of videos whose clips
    are all scored or failed for good in the score stage (the others wait for a later run)."""
    rows = clips_with_media(ctx, partition, keys)
    table = ctx.config.score_table
    if table is None or not rows.num_rows:
        return rows
    corpus = ctx.corpus
    clips = corpus.read("clips", columns=["clip_id", "video_id"], partition=partition)
    stage, _, _ = graph.family_lineage(table) or ("", "", "")  # score:<key>
    failed = final_errors(corpus, stage, partition)
    settled = pc.or_(pc.is_in(clips.column("clip_id"), corpus.done_keys(table, partition)),
                     pc.is_in(clips.column("clip_id"), failed))
    waiting = pc.unique(pc.filter(clips.column("video_id"), pc.invert(settled)))
    return rows.filter(pc.invert(pc.is_in(rows.column("video_id"), waiting)))


def _scores(ctx: StageContext, partition: str, items: Sequence[Item]) -> tuple[dict[str, float], set[str]]:
    """The scores (``shards.score_by``) of the batch's clips, and the clips the score filter
    leaves out: below ``min_score``, outside the best ``score_top_fraction`` of their video, or
    without a score while a filter is set; only clips of the splits in ``score_splits``."""
    cfg: Config = ctx.config
    table = cfg.score_table
    assert table is not None
    corpus, scfg = ctx.corpus, cfg.shards
    videos = sorted({i.rows[0]["video_id"] for i in items})
    members = corpus.read("clips", columns=["clip_id", "video_id"], filter=ds.field("video_id").isin(videos),
                          partition=partition)
    ids = members.column("clip_id").to_pylist()
    rows = corpus.read(table, columns=["clip_id", scfg.score_by], filter=ds.field("clip_id").isin(ids),
                       partition=partition).to_pylist()
    scores = {r["clip_id"]: r[scfg.score_by] for r in rows if r[scfg.score_by] is not None}
    filtered = [i for i in items if i.rows[0]["split"] in scfg.score_splits]
    if not scfg.score_filter or not filtered:
        return scores, set()
    dropped: set[str] = set()
    if scfg.min_score is not None:
        dropped |= {i.key for i in filtered if scores.get(i.key, -math.inf) < scfg.min_score}
    if scfg.score_top_fraction is not None:
        by_video: dict[str, list[str]] = {}
        for cid, vid in zip(ids, members.column("video_id").to_pylist()):
            by_video.setdefault(vid, []).append(cid)
        kept: set[str] = set()
        for clips in by_video.values():
            ranked = sorted((c for c in clips if c in scores), key=lambda c: (-scores[c], c))
            kept |= set(ranked[:math.ceil(scfg.score_top_fraction * len(clips))])
        dropped |= {i.key for i in filtered if i.key not in kept}
    dropped |= {i.key for i in filtered if i.key not in scores}
    return scores, dropped


def _why_dropped(key: str, scores: dict[str, float], cfg: Config) -> str:
    if key not in scores:
        return "dropped_no_score"
    below = cfg.shards.min_score is not None and scores[key] < cfg.shards.min_score
    return "dropped_min_score" if below else "dropped_top_fraction"


def process(items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
    """Shards of one batch (one split of one partition): score filter, cut, read features,
    write both."""
    cfg: Config = ctx.config
    corpus = ctx.corpus
    wcfg = cfg.shards.webdataset
    partition = corpus.partition_of(items[0].rows[0]["video_id"])
    split = items[0].rows[0]["split"]
    outcomes: dict[str, Outcome] = {}
    scores: dict[str, float] = {}
    if cfg.score is not None:
        scores, dropped = _scores(ctx, partition, items)
        for item in items:
            if item.key in dropped:
                outcomes[item.key] = Outcome(item.key, rows=[{"clip_id": item.key, "entry": None, "split": split}],
                                             stats={_why_dropped(item.key, scores, cfg): 1})
        items = [i for i in items if i.key not in dropped]
    tables = feature_tables(corpus)
    keys = sorted(tables)
    numbers = PartitionIndex.load(corpus, partition).free_numbers(split)
    number = next(numbers)
    with tempfile.TemporaryDirectory(prefix="vlcorpus-cut-") as workdir:
        media = _cut_media(corpus, cfg, items, workdir) if wcfg.include_media else {}
        usable = []
        for item in items:
            cut = media.get(item.key)
            if isinstance(cut, BadInputError):
                outcomes[item.key] = Outcome(item.key, kind=cut.kind, message=str(cut))
            else:
                usable.append(item)
        samples = batch_samples(corpus, partition, [i.rows[0] for i in usable], tables)
        pending: list[tuple[Sample, dict[str, Any]]] = []
        size = 0
        for sample in samples:
            sample.score = scores.get(sample.clip["clip_id"])
            cut = media.get(sample.clip["clip_id"])
            mp4 = None
            if isinstance(cut, str):
                with open(cut, "rb") as handle:
                    mp4 = handle.read()
            record = encode(sample, mp4, cfg.score is not None)
            if pending and size + record_bytes(record) > wcfg.max_bytes:
                _flush(corpus, cfg, partition, split, number, pending, keys, outcomes)
                number, pending, size = next(numbers), [], 0
            pending.append((sample, record))
            size += record_bytes(record)
        if pending:
            _flush(corpus, cfg, partition, split, number, pending, keys, outcomes)
    return list(outcomes.values())


def _flush(corpus: Corpus, cfg: Config, partition: str, split: str, number: int,
           pending: list[tuple[Sample, dict[str, Any]]], keys: list[str],
           outcomes: dict[str, Outcome]) -> None:
    samples = [s for s, _ in pending]
    entry = _write(corpus, cfg, partition, split, number, samples, [r for _, r in pending], keys)
    for sample in samples:
        cid = sample.clip["clip_id"]
        outcomes[cid] = Outcome(cid, rows=[{"clip_id": cid, "entry": entry}])


@dataclass(frozen=True)
class ShardSink:
    """The shard stage's results: shards already renamed into place; committing a batch
    records them in the partition index, whose clip ids are the stage's done keys."""

    def done_keys(self, corpus: Corpus, partition: str) -> pa.Array:
        return PartitionIndex.load(corpus, partition).clips.column("clip_id").combine_chunks()

    def commit(self, corpus: Corpus, partition: str, name: str, rows: list[dict[str, Any]],
               done: list[str], stats: dict[str, dict[str, int]], replace: bool) -> None:
        index = PartitionIndex.load(corpus, partition)
        by_shard: dict[int, tuple[ShardEntry, list[str]]] = {}
        dropped: dict[str, list[str]] = {}
        for row in rows:
            entry = row["entry"]
            if entry is None:  # left out by the score filter
                dropped.setdefault(row["split"], []).append(row["clip_id"])
                continue
            by_shard.setdefault(entry.number, (entry, []))[1].append(row["clip_id"])
        for entry, clips in by_shard.values():
            index.add(entry, clips)
        for split, clips in dropped.items():
            index.drop(clips, split)
        index.save(corpus)

    def finish(self, corpus: Corpus, partition: str) -> None:
        """Nothing to merge: the partition index is one file, rewritten per batch."""


def make_stage(cfg: Config) -> Stage:
    return Stage(name="shard", output="shards", source="clips", inputs=_inputs, process=process,
                 key="clip_id", group="split", order=("video_id", "start_s"),
                 info=("media_path",), sink=ShardSink(), batch_size=cfg.shards.samples_per_shard,
                 check=_check)


def _check(cfg: Config) -> None:
    if cfg.shards.webdataset.enabled and cfg.shards.webdataset.include_media:
        require_binaries("ffmpeg")


def write_shards(ctx: StageContext, partitions: list[str] | None = None) -> dict[str, Any]:
    """The shard stage over ``partitions`` (all by default), one after the other, then the
    shard listings; returns what the build prints per format."""
    stage = make_stage(ctx.config)
    written = sum(run_partition(stage, ctx, partition, stage.batch_size).ok
                  for partition in partitions or ctx.corpus.labels())
    return listing_report(ctx.corpus, ctx.config, written)


def listing_report(corpus: Corpus, cfg: Config, written: int) -> dict[str, Any]:
    """Refresh the listings of the partitions whose shards changed, and each format's dataset
    card (README.md) from them; per enabled format, its shard and sample counts. Parquet shards
    of an older corpus get their current names first (``pipeline.shards.renames``)."""
    listings = refresh_listings(corpus)
    if rename_old_parts(corpus, listings["parquet"]):
        listings = refresh_listings(corpus)
    write_cards(corpus, cfg.name, listings)
    enabled = {"webdataset": cfg.shards.webdataset.enabled, "parquet": cfg.shards.parquet.enabled}
    return {fmt: {"written": written, "shards": len(entries), "samples": sum(e["count"] for e in entries)}
            for fmt, entries in listings.items() if enabled[fmt]}
