"""Downloads take slots of one Prefect global concurrency limit, so the limit holds across
Dask worker processes (and across builds sharing the Prefect server)."""

from __future__ import annotations

import pytest

from conftest import require_binaries
from flakyserver import flaky_server, tiny_mp4
from flows.build import run_build
from pipeline.config import parse_config

pytestmark = pytest.mark.slow


def test_download_limit_holds_across_worker_processes(tmp_path, prefect_server):
    require_binaries("ffmpeg", "ffprobe")
    from prefect.client.orchestration import get_client

    media = tiny_mp4(tmp_path / "tiny.mp4")
    # Slow answers keep every download in flight long enough for workers to overlap.
    with flaky_server(media, p429=0.0, pdrop=0.0, delay_s=0.3) as (base, stats):
        cfg = parse_config({
            "name": "limit",
            "sources": [{"type": "urls", "urls": [f"{base}/v/{i:02d}.html" for i in range(12)]}],
            "download": {"concurrency": 2, "concurrency_limit": "test-downloads"},
            # 2 processes x 2 threads run 4 batches at once, each with 2 download threads.
            "execution": {"batch_size": 2, "n_workers": 2, "threads_per_worker": 2},
        })
        summary = run_build(cfg, root=str(tmp_path / "corpus"), until="download")
    assert summary["stages"]["download"]["ok"] == 12
    assert len(summary["stages"]["download"]["workers"]) == 2
    assert 1 <= stats.max_in_flight <= 2, f"{stats.max_in_flight} requests in flight, limit 2"
    with get_client(sync_client=True) as client:
        limit = client.read_global_concurrency_limit_by_name("test-downloads")
    assert limit.limit == 2 and limit.active_slots == 0
