"""60 videos from a server that fails a share of requests (503) and drops connections: every
video ends up downloaded or in errors, none twice, and the concurrency limit holds. (A 429 is a
block, not a flaky server: test_download_blocks.py.) 60 videos are some 270 requests: a few
dozen misbehave (one in seven), and four downloads are in flight through most of them."""

from __future__ import annotations

import pytest

from conftest import require_binaries
from flakyserver import flaky_server, tiny_mp4
from pipeline.download import stage as download
from pipeline.config import parse_config
from pipeline.discover import discover
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow


def test_60_videos_through_a_flaky_server(tmp_path):
    require_binaries("ffmpeg", "ffprobe")
    media = tiny_mp4(tmp_path / "tiny.mp4")
    with flaky_server(media, p429=0.1, pdrop=0.05, error_code=503) as (base, stats):
        urls = [f"{base}/v/{i:03d}.html" for i in range(60)]
        cfg = parse_config({
            "name": "load",
            "sources": [{"type": "urls", "urls": urls}],
            # No pacing: the limit under test is the concurrency.
            "download": {"concurrency": 4, "per_host": None, "rate_limit": None},
            "execution": {"batch_size": 25, "retries": 3, "retry_backoff_s": 0.05,
                          "retry_backoff_max_s": 0.2},
        })
        ctx = context(Corpus(str(tmp_path / "corpus")), cfg)
        assert discover(ctx).added == 60
        first = run_stage(download.STAGE, ctx, cfg.execution.batch_size)
        assert first.items == 60
        assert stats.max_in_flight <= 4, f"{stats.max_in_flight} requests in flight, limit 4"
        assert stats.throttled > 0 and stats.dropped > 0  # the server did misbehave
        corpus = ctx.corpus
        done = corpus.done("downloads")
        failed = set(corpus.read("errors").column("item_id").to_pylist())
        assert set(done) | failed == set(corpus.done("videos"))
        assert not set(done) & failed
        assert corpus.read("downloads").num_rows == len(done)  # none twice
        assert validate(corpus) == []
        assert set(corpus.read("errors").column("kind").to_pylist()) <= {"transient"}

        # The server recovers: a rerun finishes what was left, and fetches nothing else.
        stats.p429 = stats.pdrop = 0.0
        fetched = sum(stats.served_media.values())
        second = run_stage(download.STAGE, ctx, cfg.execution.batch_size)
        assert second.items == len(failed) and second.ok == len(failed)
        assert sum(stats.served_media.values()) - fetched == len(failed)
        assert len(corpus.done("downloads")) == 60 and validate(corpus) == []


def test_demo_site_media_and_subtitles_land(demo_corpus):
    root, site = demo_corpus
    corpus = Corpus(str(root))
    rows = {r["video_id"]: r for r in corpus.read("downloads").to_pylist()}
    assert len(rows) == 2
    for row in rows.values():
        assert (root / row["media_path"]).stat().st_size == row["bytes"] > 0
        assert row["has_audio"] and row["duration_s"] > 10 and (row["width"], row["height"]) == (320, 240)
        assert sorted(s["lang"] for s in row["subtitles"]) == ["en", "en-auto"]
        for sub in row["subtitles"]:
            assert (root / sub["path"]).read_text().startswith("WEBVTT")
            assert sub["path"] == f"subs/{row['video_id']}.{sub['lang']}.vtt"
    errors = {r["item_id"].split("-")[1]: r for r in corpus.read("errors").to_pylist()}
    assert errors["broken"]["kind"] == "bad_input" and errors["gone"]["kind"] == "permanent"
    assert not any(str(root) in e["message"] for e in errors.values())
    assert "404" in errors["gone"]["message"]
    assert not any(p.name.startswith("generic-broken") for p in (root / "media").iterdir())
    assert validate(corpus) == []
