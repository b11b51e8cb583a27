"""Downloads take slots of Prefect global concurrency limits (all downloads, and per host) and
turns of a Prefect rate limit, so the limits hold across Dask worker processes (and across
builds sharing the Prefect server)."""

from __future__ import annotations

import pytest

from conftest import require_binaries
from flakyserver import flaky_server, tiny_mp4
from flows.build import run_build
from pipeline.config import parse_config

pytestmark = pytest.mark.slow


def test_download_limits_hold_across_worker_processes(tmp_path, prefect_server):
    require_binaries("ffmpeg", "ffprobe")
    from prefect.client.orchestration import get_client

    media = tiny_mp4(tmp_path / "tiny.mp4")
    # Slow answers keep every download in flight long enough for workers to overlap.
    with flaky_server(media, p429=0.0, pdrop=0.0, delay_s=0.3) as (base, stats):
        port = base.rsplit(":", 1)[1]
        # One server under two host names: the per-host limit counts each apart.
        urls = [f"http://{host}:{port}/v/{i:02d}.html"
                for i in range(6) for host in ("127.0.0.1", "localhost")]
        cfg = parse_config({
            "name": "limit",
            "sources": [{"type": "urls", "urls": urls}],
            "download": {"concurrency": 2, "per_host": 1, "rate_limit": 600,
                         "concurrency_limit": "test-downloads"},
            # 2 processes x 2 threads run 4 batches at once, each with 2 download threads.
            "execution": {"batch_size": 2, "n_workers": 2, "threads_per_worker": 2},
        })
        summary = run_build(cfg, root=str(tmp_path / "corpus"), until="download")
    assert summary["stages"]["download"]["ok"] == 12
    assert len(summary["stages"]["download"]["workers"]) == 2
    assert 1 <= stats.max_in_flight <= 2, f"{stats.max_in_flight} requests in flight, limit 2"
    assert stats.max_in_flight_by_host == {"127.0.0.1": 1, "localhost": 1}
    names = ("test-downloads", "test-downloads-host-127_0_0_1", "test-downloads-host-localhost",
             "test-downloads-rate")
    with get_client(sync_client=True) as client:
        limits = {name: client.read_global_concurrency_limit_by_name(name) for name in names}
    assert [limit.limit for limit in limits.values()] == [2, 1, 1, 2]
    assert [limit.active_slots for limit in limits.values()][:3] == [0, 0, 0]
    # The rate limit's 2 slots (one for each download in flight) free at 600 a minute.
    assert limits["test-downloads-rate"].slot_decay_per_second == 10


def test_slots_a_killed_build_left_held_are_freed_by_the_next_temporary_server(tmp_path, monkeypatch):
    """A killed build's slots stay counted in the database after its temporary server (which
    kept their leases in memory) is gone; the next build's temporary server frees them."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    from flows.services import prefect_server

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))  # one database for both builds
    with prefect_server() as up:
        up()
        with get_client(sync_client=True) as client:
            client.upsert_global_concurrency_limit_by_name("vlcorpus-download", 2)
            client.update_global_concurrency_limit(
                "vlcorpus-download", GlobalConcurrencyLimitUpdate(active_slots=2))
    with prefect_server() as up:
        up()
        with get_client(sync_client=True) as client:
            assert client.read_global_concurrency_limit_by_name("vlcorpus-download").active_slots == 0
