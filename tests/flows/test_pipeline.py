"""A pipelined build: partitions move through download → … → shard as chains of tasks, at most
``max_inflight_partitions`` at once; with ``keep_media: false`` a partition's media is gone once
it is sharded, and a later stage that needs it downloads it again."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import require_binaries
from sitekit import copy_site, spread_pages
from flows.build import run_build
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("builds_fork_server")]
VIDEOS = 4
PARTITIONS = 2


def _config(urls: list[str], extractors: list[str]):
    return parse_config({
        "name": "pipelined",
        "sources": [{"type": "urls", "urls": urls}],
        "transcribe": {"prefer": ["manual"]},
        "features": {"extractors": [{"name": e, "fps": 1, "weights": "none", "short_side": 64,
                                     "crop": 48} for e in extractors]},
        "storage": {"keep_media": False},
        "execution": {"partitions": PARTITIONS, "max_inflight_partitions": 1, "retry_backoff_s": 0},
    })


class _MediaWatch:
    """Samples which media files are under the root while a build runs."""

    def __init__(self, media: Path) -> None:
        self.media, self.peak, self.stop = media, set(), threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            if self.media.exists():
                now = {p.stem for p in self.media.iterdir() if p.suffix == ".mp4"}
                if len(now) > len(self.peak):
                    self.peak = now
            time.sleep(0.02)

    def __enter__(self) -> _MediaWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def test_pipelined_build_bounds_media_and_downloads_again_when_needed(demo_corpus, tmp_path,
                                                                      prefect_server):
    require_binaries("ffmpeg", "ffprobe")
    site = copy_site(demo_corpus, tmp_path)
    root = tmp_path / "corpus"
    with serve_demo(site) as base:
        urls = spread_pages(site, base, VIDEOS, PARTITIONS)
        with _MediaWatch(root / "media") as watch:
            first = run_build(_config(urls, ["resnet34"]), root=str(root), until="shard")
        corpus = Corpus(str(root))
        sizes = Counter(corpus.partition_of(v) for v in corpus.distinct("videos", "video_id"))
        assert sorted(sizes.values()) == [VIDEOS // PARTITIONS] * PARTITIONS, sizes
        # One partition at a time: never the media of two partitions on disk together.
        assert watch.peak and len(watch.peak) <= max(sizes.values())
        assert len({corpus.partition_of(v) for v in watch.peak}) == 1
        downloads = corpus.read("downloads").to_pylist()
        assert len(downloads) == VIDEOS and all(d["released_at"] for d in downloads)
        assert not list((root / "media").glob("*.mp4"))
        assert first["stages"]["shard"]["media_released"] == VIDEOS
        clips = corpus.read("clips").num_rows
        assert first["stages"]["shard"]["webdataset"]["samples"] == clips > 0

        # A new extractor needs the frames again: its partitions download them again.
        second = run_build(_config(urls, ["resnet34", "resnet50"]), root=str(root), until="shard")
    assert second["stages"]["download"]["ok"] == VIDEOS and second["stages"]["download"]["total"] == VIDEOS
    assert second["stages"]["featurize:resnet34"]["items"] == 0
    assert second["stages"]["featurize:resnet50"]["ok"] == clips
    assert second["stages"]["shard"]["items"] == 0  # features added later do not reshard
    downloads = corpus.read("downloads").to_pylist()
    assert len(downloads) == VIDEOS and all(d["released_at"] for d in downloads)
    assert not list((root / "media").glob("*.mp4"))
    assert validate(corpus) == [] and corpus.partitions == PARTITIONS
