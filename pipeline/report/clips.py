"""A few sample clips for the report: spread over the corpus, each with its middle frame (when
the media is still on disk), its sentence and its video's title."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.media import FrameRequest, FrameSpec, sample_frames
from pipeline.progress import log
from pipeline.report.plots import plt, png_uri
from pipeline.corpus.storage import Corpus

SAMPLE_CLIPS = 12


def sample_clips(corpus: Corpus, limit: int) -> list[dict[str, Any]]:
    """A few clips spread over the corpus: the middle clip of the first ``limit`` partitions
    that have clips (more from each when there are fewer partitions)."""
    labels = corpus.partitions_of("clips")
    if not labels:
        return []
    per_partition = max(1, -(-limit // len(labels)))
    chosen: list[dict[str, Any]] = []
    columns = ["clip_id", "video_id", "start_s", "end_s", "text", "source"]
    for partition in labels:
        clips = corpus.read("clips", columns=columns, partition=partition).sort_by("clip_id")
        step = max(1, clips.num_rows // per_partition)
        rows = list(range(step // 2, clips.num_rows, step))[:per_partition]
        chosen += clips.take(pa.array(rows, pa.int64())).to_pylist()
        if len(chosen) >= limit:
            break
    return chosen[:limit]


def thumbnails(corpus: Corpus, limit: int = SAMPLE_CLIPS) -> list[dict[str, Any]]:
    """Middle frames of a few clips (spread over the corpus), with their sentence and title."""
    chosen = sample_clips(corpus, limit)
    by_video: dict[str, list[dict[str, Any]]] = {}
    for clip in chosen:
        by_video.setdefault(clip["video_id"], []).append(clip)
    cards = []
    for video, group in by_video.items():
        partition = corpus.partition_of(video)
        download = corpus.read("downloads", columns=["media_path", "released_at"],
                               filter=pc.field("video_id") == video, partition=partition).to_pylist()
        title = corpus.read("videos", columns=["title"], filter=pc.field("video_id") == video,
                            partition=partition).to_pylist()
        requests = [FrameRequest(c["clip_id"], c["start_s"], c["end_s"],
                                 FrameSpec(frames=1, short_side=128, crop=None)) for c in group]
        frames: dict[str, Any] = {}
        if download and download[0]["media_path"] and download[0]["released_at"] is None:
            try:
                with corpus.local_file(download[0]["media_path"]) as path:
                    frames = dict(sample_frames(path, requests))
            except OSError as exc:  # media moved or deleted since: the card shows no frame
                log.warning("report: no thumbnails for %s: %s", video, exc)
        for clip in group:
            image = frames.get(clip["clip_id"])
            uri = None
            if isinstance(image, np.ndarray):
                buffer = io.BytesIO()
                plt.imsave(buffer, image[0], format="png")
                uri = png_uri(buffer.getvalue())
            cards.append({**clip, "title": title[0]["title"] if title else None, "image": uri})
    return cards
