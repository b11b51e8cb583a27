"""Downloads against a local site that blocks the session (every request refused with 429 or
403 for a while after some requests), one page that is always 403, media whose signed URL
expires, captions that 404 or do not parse, and a blocked proxy: no video is lost to a block,
the always-403 page ends permanent once a second run meets its 403 again, a block past
max_block_s stops the stage with the rest left to do, and a failing caption track fails alone.
Real yt-dlp, real HTTP, the runner in-process."""

from __future__ import annotations

import json
import logging
import time
import traceback
import uuid

import pytest

from conftest import require_binaries
from flakyserver import Block, flaky_server, forward_proxy, tiny_mp4
from pipeline.transcribe import stage as transcribe
from pipeline.download import breaker, stage as download, limits
from pipeline.config import parse_config
from pipeline.discover import discover
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> bytes:
    require_binaries("ffmpeg", "ffprobe")
    return tiny_mp4(tmp_path_factory.mktemp("media") / "tiny.mp4")


def _ctx(root, urls: list[str], **download_cfg):
    cfg = parse_config({
        "name": "blocks",
        "sources": [{"type": "urls", "urls": urls}],
        "download": {
            # A breaker of this test's own: the process-wide store outlives a test.
            "concurrency_limit": f"t-{uuid.uuid4().hex[:12]}",
            "concurrency": 2, "per_host": None, "rate_limit": None,
            "subtitle_langs": ["en", "en-auto"],
            "block_threshold": 2, "block_cooldown_s": 0.5, "block_cooldown_max_s": 2,
            **download_cfg},
        "transcribe": {"prefer": ["manual", "auto"]},
        # One partition: videos go in id order whatever the server's port (ids hash the URL),
        # so the always-403 page has videos after it in its batch to judge it by.
        "execution": {"batch_size": 8, "retries": 1, "retry_backoff_s": 0.05, "partitions": 1},
    })
    ctx = context(Corpus(str(root)), cfg)
    discover(ctx)
    return ctx


def _last_errors(ctx) -> dict[str, dict]:
    rows = sorted(ctx.corpus.read("errors").to_pylist(), key=lambda r: (r["item_id"], r["time"]))
    return {row["item_id"]: row for row in rows}


def _ids(ctx, word: str) -> set[str]:
    return {v for v in ctx.corpus.done("videos") if word in v}


@pytest.mark.slow
@pytest.mark.parametrize("code", [429, 403])
def test_no_video_is_lost_to_a_block(media, tmp_path, code):
    # The always-403 page comes early, while the site still serves; the block begins later. A
    # 403 is weak (2 videos trip the breaker, each refused again after a fresh extraction), so
    # that block goes on until it has refused 2 videos' pages twice: a loaded machine sends few
    # requests in 2 s. It ends then, within the first run: the second run meets only the
    # always-403 page's own refusal (a 403 of the first run that downloads got through after
    # counts toward no trip: once it did, and the page was judged a block). (A 429 trips it at
    # once, and then only the one download let through after each pause meets the block.)
    block = Block(after=45, seconds=2.0, code=code, videos=2 if code == 403 else 0)
    with flaky_server(media, p429=0, pdrop=0, block=block) as (base, stats):
        urls = [f"{base}/v/{i:02d}.html" for i in range(20)] + [f"{base}/v/02-forbidden.html"]
        ctx = _ctx(tmp_path, urls)
        first = run_stage(download.STAGE, ctx, 8)
        assert block.refused > 0  # the block did happen
        forbidden = _ids(ctx, "forbidden")
        after_first = _last_errors(ctx)
        # Nothing failed for good: one run's 403s decide nothing, the always-403 page's included.
        assert {e["kind"] for e in after_first.values()} <= {"blocked"} and forbidden <= set(after_first)
        assert first.figures["pauses"] >= 1 and first.figures["paused_s"] > 0
        assert first.figures["refusals"] > 0
        second = run_stage(download.STAGE, ctx, 8)  # the next run, without --retry-failed
    done = set(ctx.corpus.done("downloads"))
    assert done == set(ctx.corpus.done("videos")) - forbidden
    # Refused again while the others downloaded: the page's own 403, permanent.
    assert second.errors == {"permanent": 1}
    message = _last_errors(ctx)[forbidden.pop()]["message"]
    assert "403" in message and "other videos downloaded" in message
    assert stats.served_pages["02-forbidden"] == 4  # extracted again once in each run
    assert ctx.corpus.read("downloads").num_rows == len(done)  # none twice
    # Each run that had videos to do left its figures for the report.
    runs = sorted((tmp_path / "runs" / "download").iterdir())
    assert len(runs) == 1 + (second.items > 0)
    figures = json.loads(runs[0].read_text())
    assert figures["videos"] == 21 and figures["pauses"] >= 1 and figures["per_minute"] > 0


@pytest.mark.slow
def test_a_block_past_max_block_s_stops_the_stage_and_leaves_the_rest_to_do(media, tmp_path, caplog):
    block = Block(after=12, seconds=float("inf"))
    with flaky_server(media, p429=0, pdrop=0, block=block) as (base, stats):
        ctx = _ctx(tmp_path, [f"{base}/v/{i:02d}.html" for i in range(16)], max_block_s=2)
        with caplog.at_level(logging.WARNING, logger="vlcorpus"):
            first = run_stage(download.STAGE, ctx, 8)
        assert first.stopped and "download.max_block_s (2 s)" in first.stopped
        assert "cookies" in first.stopped and "proxies" in first.stopped
        assert first.stopped in caplog.text
        assert first.left > 0 and first.ok + sum(first.errors.values()) + first.left == 16
        assert set(first.errors) <= {"blocked"}  # nothing failed for good
        assert first.figures["stopped"] == first.stopped and first.figures["left"] == first.left
        stats.block = None  # the block is lifted; the next run goes once the pause is over
        breaker = limits.store(f"{ctx.config.download.concurrency_limit}-breaker")
        time.sleep(max(0.0, breaker.read(["direct"])["direct"]["open_until"] - time.time()))
        second = run_stage(download.STAGE, ctx, 8)
    assert second.skipped_failed == 0 and not second.stopped
    assert len(ctx.corpus.done("downloads")) == 16


def test_a_bug_in_the_breaker_is_no_verdict_on_the_videos(media, tmp_path, monkeypatch, caplog):
    """The breaker raises on every refusal (as its TypeError did on a second trip): the videos
    it met are internal errors that say so, the traceback is in the log, and the next run
    (without --retry-failed) downloads them."""

    def broken(*args, **kwargs):
        raise RuntimeError("injected: the breaker's own bug")

    block = Block(after=12, seconds=1.0)
    with flaky_server(media, p429=0, pdrop=0, block=block) as (base, _):
        ctx = _ctx(tmp_path, [f"{base}/v/{i:02d}.html" for i in range(12)])
        with monkeypatch.context() as patch, caplog.at_level(logging.ERROR, logger="vlcorpus"):
            patch.setattr(breaker, "refused", broken)
            first = run_stage(download.STAGE, ctx, 8)
        assert block.refused > 0 and first.errors.get("internal", 0) > 0
        errors = _last_errors(ctx)
        assert {e["kind"] for e in errors.values()} == {"internal"}
        assert all(e["message"].startswith("internal error (a bug in vlcorpus, not a verdict")
                   and "RuntimeError: injected" in e["message"] for e in errors.values())
        assert any(r.exc_info and "breaker.py" in "".join(traceback.format_exception(*r.exc_info))
                   for r in caplog.records)
        time.sleep(max(0.0, block.ends - time.monotonic()))
        second = run_stage(download.STAGE, ctx, 8)
    assert second.skipped_failed == 0 and second.ok == len(errors)
    assert len(ctx.corpus.done("downloads")) == 12


def test_expired_media_url_is_extracted_again_once(media, tmp_path):
    with flaky_server(media, p429=0, pdrop=0) as (base, stats):
        ctx = _ctx(tmp_path, [f"{base}/v/expiring.html", f"{base}/v/00.html"])
        report = run_stage(download.STAGE, ctx, 8)
    assert report.ok == 2 and report.errors == {}
    assert stats.served_pages["expiring"] == 2 and stats.expired == {"expiring"}


def test_a_caption_track_that_404s_or_does_not_parse_fails_alone(media, tmp_path):
    with flaky_server(media, p429=0, pdrop=0) as (base, _):
        urls = [f"{base}/v/{stem}.html" for stem in ("00", "cap404", "capbad")]
        ctx = _ctx(tmp_path, urls)
        report = run_stage(download.STAGE, ctx, 8)
        only_en = _ctx(tmp_path / "only-en", [f"{base}/v/cap404.html"], subtitle_langs=["en"])
        alone = run_stage(download.STAGE, only_en, 8)
    assert report.ok == 3 and report.errors == {} and report.counters["subtitles_dropped"] == 2
    langs = {r["video_id"].split("-")[1]: sorted(s["lang"] for s in r["subtitles"])
             for r in ctx.corpus.read("downloads").to_pylist()}
    assert langs == {"00": ["en", "en-auto"], "cap404": ["en-auto"], "capbad": ["en-auto"]}
    assert not list((tmp_path / "subs").glob("*capbad*.en.vtt"))  # the unreadable file went
    # Transcribe takes the next source of the videos whose manual track failed.
    assert run_stage(transcribe.STAGE, ctx, 8).ok == 3
    sources = {r["video_id"].split("-")[1]: r["source"] for r in ctx.corpus.read("segments").to_pylist()}
    assert sources == {"00": "manual", "cap404": "auto", "capbad": "auto"}
    # With no other track, the video is still kept (ASR is its next source).
    assert alone.ok == 1 and only_en.corpus.read("downloads").to_pylist()[0]["subtitles"] == []


def test_a_blocked_proxy_is_rotated_out(media, tmp_path, caplog):
    secret = "rot4te-pa55"
    with (flaky_server(media, p429=0, pdrop=0) as (base, stats),
          forward_proxy(secret, refuse=429) as (blocked_port, refused),
          forward_proxy(secret) as (port, seen)):
        ctx = _ctx(tmp_path, [f"{base}/v/{i:02d}.html" for i in range(8)],
                   proxies=[f"http://user:{secret}@127.0.0.1:{blocked_port}",
                            f"http://user:{secret}@127.0.0.1:{port}"],
                   block_cooldown_s=600, block_cooldown_max_s=600)
        with caplog.at_level(logging.DEBUG, logger="vlcorpus"):
            report = run_stage(download.STAGE, ctx, 8)
    assert report.ok + report.errors.get("blocked", 0) == 8 and report.ok >= 7
    assert len(refused) <= 3  # two videos trip it (the second may be in flight); then it rests
    assert len(seen) >= 3 * report.ok and not report.stopped
    assert secret not in caplog.text
    assert all(secret not in e["message"] for e in ctx.corpus.read("errors").to_pylist())


def test_error_messages_name_files_relative_to_the_root(media, tmp_path):
    with flaky_server(media, p429=0, pdrop=0) as (base, _):
        ctx = _ctx(tmp_path, [f"{base}/v/00.html"])
        # A folder where yt-dlp writes the media: a local error that names the file.
        (vid,) = ctx.corpus.done("videos")
        (tmp_path / "media" / f"{vid}.mp4.part").mkdir(parents=True)
        report = run_stage(download.STAGE, ctx, 8)
    assert report.ok == 0
    message = ctx.corpus.read("errors").to_pylist()[0]["message"]
    assert str(tmp_path) not in message and f"media/{vid}.mp4.part" in message
