"""Downloads, and discover's playlists, when the network fails rather than a site: a resolver in
the process (tests/resolverkit.py) that stops resolving any name in the middle of a run, or one
name for good. An outage longer than max_outage_s stops the stage in one line with nothing
failed and no errors rows, and the rerun downloads (lists) every video; a shorter one only pauses
the run; a host that does not resolve is judged gone only from rows of several days apart, while
other hosts resolved. Real yt-dlp, real HTTP on 127.0.0.1, the runner in-process."""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

import pytest

from conftest import require_binaries
from flakyserver import flaky_server, tiny_mp4
from resolverkit import resolver
from pipeline.download import stage as download, gone_hosts, limits, outage
from pipeline.config import HealthConfig, parse_config
from pipeline.discover import discover
from pipeline.compose.health import assess
from pipeline.runner import error_row, run_stage
from pipeline.compose.stages import context
from pipeline.compose.status import network_down
from pipeline.corpus.storage import Corpus


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> bytes:
    require_binaries("ffmpeg", "ffprobe")
    return tiny_mp4(tmp_path_factory.mktemp("media") / "tiny.mp4")


def _ctx(root, urls: list[str], retries: int = 0, **download_cfg):
    ctx = _undiscovered(root, urls, "urls", retries, **download_cfg)
    discover(ctx)
    return ctx


def _undiscovered(root, urls: list[str], source: str, retries: int = 0, **download_cfg):
    cfg = parse_config({
        "name": "network",
        "sources": [{"type": source, "urls": urls}],
        "download": {
            # A watch of this test's own: the process-wide store outlives a test.
            "concurrency_limit": f"t-{uuid.uuid4().hex[:12]}",
            "concurrency": 2, "per_host": None, "rate_limit": None, "subtitle_langs": ["en"],
            "network_threshold": 3, "network_cooldown_s": 0.3, "network_cooldown_max_s": 0.6,
            "max_outage_s": 2, **download_cfg},
        "execution": {"batch_size": 8, "retries": retries, "retry_backoff_s": 0.05, "partitions": 1},
    })
    return context(Corpus(str(root)), cfg)


def _urls(base: str, host: str, stems: list[str]) -> list[str]:
    port = base.rsplit(":", 1)[1]
    return [f"http://{host}:{port}/v/{stem}.html" for stem in stems]


def _wait_for_the_watch(ctx) -> None:
    store = limits.store(f"{ctx.config.download.concurrency_limit}-network")
    time.sleep(max(0.0, (store.read(["network"])["network"] or {"open_until": 0})["open_until"] - time.time()))


def test_an_outage_past_max_outage_s_stops_losing_nothing_and_the_rerun_downloads_all(media, tmp_path, caplog):
    with flaky_server(media, p429=0, pdrop=0) as (base, _), resolver() as names:
        urls = _urls(base, "a.test", [f"a{i}" for i in range(4)]) + _urls(base, "b.test", [f"b{i}" for i in range(4)])
        ctx = _ctx(tmp_path, urls)
        names.outage(after=8)  # ~2 videos (page and caption per video, media once or twice)
        with caplog.at_level(logging.WARNING, logger="vlcorpus"):
            first = run_stage(download.STAGE, ctx, 8)
        assert names.failed > 0
        assert outage.network_down(first.stopped) and "download.max_outage_s (2 s)" in first.stopped
        assert "left to do, not failed" in first.stopped and first.stopped in caplog.text
        # One warning for the outage (and the stop), not one a video.
        assert sum("the network is down" in r.getMessage() for r in caplog.records) == 2
        # No verdict and no pile of rows: the videos that met the outage are left to do.
        assert first.errors == {} and ctx.corpus.read("errors").num_rows == 0
        assert first.ok + first.left == 8 and first.left > 0
        figures = first.figures
        assert figures["network_down"] and figures["outages"] >= 1 and figures["outage_s"] > 0
        # The build ends unhealthy, and status says why.
        health = assess(HealthConfig(min_found_videos=0), {"stages": {"download": asdict(first)}})
        assert any(p.startswith("the network was down: download stopped") for p in health.problems)
        assert network_down(ctx.corpus)["left"] == first.left
        names.up()
        _wait_for_the_watch(ctx)
        second = run_stage(download.STAGE, ctx, 8)
    assert not second.stopped and second.skipped_failed == 0 and second.errors == {}
    assert set(ctx.corpus.done("downloads")) == set(ctx.corpus.done("videos"))
    assert network_down(ctx.corpus) is None


def test_a_shorter_outage_only_pauses_the_run(media, tmp_path):
    with flaky_server(media, p429=0, pdrop=0) as (base, _), resolver() as names:
        urls = _urls(base, "a.test", [f"a{i}" for i in range(4)]) + _urls(base, "b.test", [f"b{i}" for i in range(4)])
        # Retries: the videos that failed before the pause are tried again once it is over.
        ctx = _ctx(tmp_path, urls, retries=2, max_outage_s=30)
        # Long enough for network_threshold (3) lookups to fail in it on a busy machine (at
        # 0.8 s, a run beside three other test processes saw two), far from max_outage_s.
        names.outage(after=6, seconds=3)
        report = run_stage(download.STAGE, ctx, 8)
    assert names.failed > 0 and report.figures["outages"] >= 1 and not report.stopped
    assert report.ok == 8 and report.errors == {} and ctx.corpus.read("errors").num_rows == 0


def _playlists(base: str) -> list[str]:
    """Eight playlists of three videos each, on two hosts in turn: an outage fails both."""
    port = base.rsplit(":", 1)[1]
    return [f"http://{host}.test:{port}/list/{host}{i}.html" for i in range(4) for host in "ab"]


def test_an_outage_pauses_discover_and_every_playlist_is_listed_when_it_is_over(media, tmp_path):
    with flaky_server(media, p429=0, pdrop=0) as (base, _), resolver() as names:
        # Retries: a playlist that failed before the pause is listed again once it is over (its
        # tries span 0.7 s here: the second playlist to fail takes the network as down by then).
        ctx = _undiscovered(tmp_path, _playlists(base), "playlist", retries=3, max_outage_s=30,
                            network_threshold=2)
        names.outage(after=2, seconds=2)  # a lookup a playlist
        started = time.time()
        report = discover(ctx)
    assert names.failed >= 3 and report.stopped is None
    assert (report.queries, report.failed_queries, report.found, report.added) == (8, 0, 24, 24)
    assert ctx.corpus.read("errors").num_rows == 0
    # Paused by the watch that downloads pause by: the same store, the same outage.
    assert outage.watch(ctx.config.download, outage.DOWNLOADS).paused(started, time.time())[0] >= 1


def test_an_outage_past_max_outage_s_stops_discover_judging_no_playlist(media, tmp_path, caplog):
    with flaky_server(media, p429=0, pdrop=0) as (base, _), resolver() as names:
        ctx = _undiscovered(tmp_path, _playlists(base), "playlist", max_outage_s=1)
        names.outage(after=2)
        with caplog.at_level(logging.WARNING, logger="vlcorpus"):
            first = discover(ctx)
        names.up()
        _wait_for_the_watch(ctx)
        second = discover(ctx)
    assert first.stopped.startswith("discover stopped: the network is down") and outage.network_down(first.stopped)
    assert "The searches and playlists not listed are not failed" in first.stopped
    assert sum(first.stopped in r.getMessage() for r in caplog.records) == 1
    # Listed before the outage: kept; failed on the network before it counted as down: transient
    # (every run lists every query); the rest not listed, with no row.
    assert first.added == 3 * (8 - first.left - first.failed_queries) and first.left > 0
    assert set(ctx.corpus.read("errors").column("kind").to_pylist()) <= {"transient"}
    health = assess(HealthConfig(min_found_videos=0), {"stages": {"discover": asdict(first)}})
    assert f"the network was down: discover stopped with {first.left} items left to do for the next run" \
        in health.problems
    assert second.stopped is None and second.failed_queries == 0 and len(ctx.corpus.done("videos")) == 24


def _evidence(ctx, video: str, host: str, *days_ago: int) -> None:
    """Rows earlier runs would have left: ``host`` did not resolve while others did."""
    now = datetime.now(UTC)
    rows = [error_row("download", video, "transient", "Failed to resolve ([Errno -2] Name or "
                      f"service not known){gone_hosts.evidence(host)}", 1, now - timedelta(days=d))
            for d in days_ago]
    ctx.corpus.write_batch("errors", rows, f"earlier-{uuid.uuid4().hex[:8]}", ctx.corpus.partition_of(video))


def _last(ctx) -> dict[str, dict]:
    rows = sorted(ctx.corpus.read("errors").to_pylist(), key=lambda r: r["time"])
    return {r["item_id"]: r for r in rows}


def test_a_host_is_gone_only_after_days_apart_of_failing_to_resolve_while_others_do(media, tmp_path):
    with flaky_server(media, p429=0, pdrop=0) as (base, _), resolver(gone={"gone.test"}):
        # The gone host's videos sort after the others: other hosts were reached by then.
        urls = _urls(base, "live.test", ["l0", "l1", "l2"]) + _urls(base, "gone.test", ["z0", "z1"])
        recent = _ctx(tmp_path / "recent", urls)
        gone = sorted(v for v in recent.corpus.done("videos") if "-z" in v)
        _evidence(recent, gone[0], "gone.test", 3, 1)  # three days, but within a week
        apart = _ctx(tmp_path / "apart", urls)
        _evidence(apart, gone[0], "gone.test", 9, 4)
        runs = [run_stage(download.STAGE, ctx, 8) for ctx in (recent, apart)]
        again = run_stage(download.STAGE, apart, 8)  # the next run, without --retry-failed
    assert [r.ok for r in runs] == [3, 3]
    assert runs[0].errors == {"transient": 2} and runs[1].errors == {"permanent": 2}
    for video in gone:
        assert _last(recent)[video]["message"].endswith("[gone.test did not resolve while other hosts did]")
        message = _last(apart)[video]["message"]
        assert message.startswith("host gone: gone.test did not resolve on 3 days from ")
        assert "Name or service not known" in message
    assert again.skipped_failed == 2 and again.todo == 0
