"""Downloads take slots of global concurrency limits (all downloads, and per host) and turns of
a rate limit that hold across Dask worker processes: Prefect's, so that builds sharing a
Prefect server share them, or, for a build on its own temporary server, the Dask cluster's."""

from __future__ import annotations

import pytest

from conftest import require_binaries
from flakyserver import flaky_server, tiny_mp4
from flows.build import run_build
from pipeline.config import parse_config

pytestmark = pytest.mark.slow


def _limited_build(tmp_path) -> None:
    """12 downloads from one server under two host names, on 2 worker processes running 4
    batches at once, under a limit of 2, 1 per host and 600 a minute: the limits hold."""
    require_binaries("ffmpeg", "ffprobe")
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


def test_download_limits_hold_across_worker_processes(tmp_path, prefect_server):
    from prefect.client.orchestration import get_client

    _limited_build(tmp_path)
    names = ("test-downloads", "test-downloads-host-127_0_0_1", "test-downloads-host-localhost",
             "test-downloads-rate")
    with get_client(sync_client=True) as client:
        limits = {name: client.read_global_concurrency_limit_by_name(name) for name in names}
    assert [limit.limit for limit in limits.values()] == [2, 1, 1, 2]
    assert [limit.active_slots for limit in limits.values()][:3] == [0, 0, 0]
    # The rate limit's 2 slots (one for each download in flight) free at 600 a minute.
    assert limits["test-downloads-rate"].slot_decay_per_second == 10


def test_on_its_own_temporary_server_a_build_holds_its_limits_on_its_cluster(tmp_path, monkeypatch):
    """No Prefect server configured: the build runs on a temporary server of its own, its Dask
    cluster holds the limits (flows/cluster_limits.py), and they hold across its workers."""
    from prefect.client.orchestration import get_client

    from flows.services import on_temporary_server, prefect_server

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with prefect_server() as up:  # the server the build uses, as the CLI starts it
        up()
        assert on_temporary_server()
        _limited_build(tmp_path)
        with get_client(sync_client=True) as client:  # none of Prefect's limits were used
            assert client.read_global_concurrency_limits() == []
    assert not on_temporary_server()
