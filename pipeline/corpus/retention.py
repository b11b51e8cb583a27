"""Media retention (``storage.keep_media: false``): a partition's media files are deleted once
nothing pending needs them, and a video whose media a stage needs again is downloaded again.

Release first records ``released_at`` in the partition's downloads rows (one atomic rewrite),
then deletes the files: a kill in between leaves files that the next release deletes, never a
row that claims media that is gone. Files outside the root (folder sources) are never deleted.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import graph
from pipeline.config import Config
from pipeline.ids import feature_key
from pipeline.runner import StageContext, final_errors
from pipeline.shards.index import PartitionIndex


def _pending_clips(ctx: StageContext, partition: str, clips: pa.Table, done: pa.Array,
                   stage: str) -> pa.Array:
    """Video ids of clips neither done nor failed for good in ``stage``."""
    final = final_errors(ctx.corpus, stage, partition)
    settled = pc.or_(pc.is_in(clips.column("clip_id"), done), pc.is_in(clips.column("clip_id"), final))
    return pc.unique(pc.filter(clips.column("video_id"), pc.invert(settled)))


def media_needed(ctx: StageContext, partition: str) -> pa.Array:
    """Videos of the partition whose media a stage still has to read: clips not yet featurized
    by a visual extractor, or not yet cut into shards, or videos not yet transcribed."""
    cfg: Config = ctx.config
    corpus = ctx.corpus
    clips = corpus.read("clips", columns=["clip_id", "video_id"], partition=partition)
    needed = [pa.array([], pa.string())]
    for extractor in cfg.features.extractors:
        if not extractor.is_text:
            key = feature_key(extractor.name)
            done = corpus.done_keys(f"{graph.FEATURES}/{key}", partition)
            needed.append(_pending_clips(ctx, partition, clips, done, f"featurize:{key}"))
    if cfg.shards.webdataset.enabled and cfg.shards.webdataset.include_media:
        done = PartitionIndex.load(corpus, partition).clips.column("clip_id").combine_chunks()
        needed.append(_pending_clips(ctx, partition, clips, done, "shard"))
    if "asr" in cfg.transcribe.prefer:
        downloaded = corpus.read("downloads", columns=["video_id"], partition=partition).column("video_id")
        transcribed = corpus.done_keys("segments", partition)
        needed.append(pc.filter(downloaded, pc.invert(pc.is_in(downloaded, transcribed))).combine_chunks())
    return pc.unique(pa.concat_arrays([a.cast(pa.string()) for a in needed]))


def needed_again(ctx: StageContext, partition: str) -> pa.Array:
    """Videos whose media was released and that a pending stage needs: the download stage
    does them again."""
    downloads = ctx.corpus.read("downloads", columns=["video_id", "released_at"], partition=partition)
    released = pc.filter(downloads.column("video_id"), pc.is_valid(downloads.column("released_at")))
    if not len(released):
        return pa.array([], pa.string())
    return pc.filter(released, pc.is_in(released, media_needed(ctx, partition))).combine_chunks()


def release(ctx: StageContext, partition: str) -> int:
    """Delete the partition's media that nothing pending needs; returns how many files."""
    corpus = ctx.corpus
    downloads = corpus.read("downloads", partition=partition)
    if not downloads.num_rows:
        return 0
    held = pc.and_(pc.is_null(downloads.column("released_at")),
                   pc.invert(pc.is_in(downloads.column("video_id"), media_needed(ctx, partition))))
    # Absolute paths are files of a folder source: the user's, not the corpus's.
    inside = pa.array([p is not None and not os.path.isabs(p)
                       for p in downloads.column("media_path").to_pylist()])
    releasing = pc.and_(held, inside)
    if not pc.any(releasing).as_py():
        return _delete_released(ctx, downloads)
    now = pa.scalar(datetime.now(UTC), downloads.schema.field("released_at").type)
    stamped = downloads.set_column(
        downloads.schema.get_field_index("released_at"), "released_at",
        pc.if_else(releasing, now, downloads.column("released_at")))
    changed = stamped.filter(releasing)
    corpus.replace_rows("downloads", partition, changed, changed.column("video_id").to_pylist())
    return _delete_released(ctx, stamped)


def _delete_released(ctx: StageContext, downloads: pa.Table) -> int:
    corpus = ctx.corpus
    deleted = 0
    released = downloads.filter(pc.is_valid(downloads.column("released_at")))
    for path in released.column("media_path").to_pylist():
        if path and not os.path.isabs(path) and corpus.fs.exists(corpus.path(path)):
            corpus.fs.rm(corpus.path(path))
            deleted += 1
    return deleted
