"""Partitions: every video belongs to one of a fixed number of partitions, by a stable hash of
its id, and every per-video table is stored partition by partition (DESIGN.md, scale).

The number is chosen at a corpus's first build (``execution.partitions``, or from the number
of videos discovered) and recorded in the root; it never changes for that root, since a
different number would move videos between partitions.
"""

from __future__ import annotations

import hashlib
import math

# Directory names are ``partition=<label>``: five digits sort in partition order.
LABEL_DIGITS = 5
MAX_PARTITIONS = 10**LABEL_DIGITS
# Errors of no video (a search that failed, a list record without a URL, training) live here.
CORPUS = "corpus"
# A partition holds about this many videos at scale: ~600 HowTo100M videos (~10 GB of 480p
# media, ~60k clips) per partition at 2048 partitions, and 1 to 5 Prefect task runs per
# partition (its chain: one task, or one for each run of stages on one kind of worker).
VIDEOS_PER_PARTITION = 1000
# Small corpora still get a few partitions, so that stages overlap and workers share the work,
# but not so many that Prefect's bookkeeping of each partition's tasks outweighs the overlap:
# the copy build of bench/vs_video2dataset.py's 20 one-minute videos took 30-36 s in 8 partitions,
# 27-33 s in 4.
MIN_VIDEOS_PER_PARTITION = 8
SMALL_CORPUS_PARTITIONS = 8


def index_of(video_id: str, partitions: int) -> int:
    """The partition of a video: a salted hash, independent of the split hash of align."""
    digest = hashlib.sha1(f"vlcorpus-partition:{video_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % partitions


def label(index: int) -> str:
    return f"{index:0{LABEL_DIGITS}d}"


def labels(partitions: int) -> list[str]:
    return [label(i) for i in range(partitions)]


def partition_of(video_id: str, partitions: int) -> str:
    return label(index_of(video_id, partitions))


def video_of_clip(clip: str) -> str:
    """The video of a clip id (``<video_id>-<start_ms>-<end_ms>``, see ids.clip_id)."""
    return clip.rsplit("-", 2)[0]


def _next_pow2(n: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(1, n))))


def choose(videos: int) -> int:
    """The default number of partitions for a corpus of ``videos`` videos: a power of two near
    videos / VIDEOS_PER_PARTITION, and up to SMALL_CORPUS_PARTITIONS for small corpora."""
    at_scale = _next_pow2(math.ceil(videos / VIDEOS_PER_PARTITION))
    small = min(SMALL_CORPUS_PARTITIONS, _next_pow2(math.ceil(videos / MIN_VIDEOS_PER_PARTITION)))
    return max(1, at_scale, small)
