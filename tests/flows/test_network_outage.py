"""A network outage in the middle of a real build (Prefect server, Dask worker processes, real
yt-dlp against a site on 127.0.0.1 whose names stop resolving in every process): the build
says the network is down, stops downloads with nothing failed and no errors rows, says the stop
once for the partitions in flight, ends unhealthy, status says why; the rerun after the outage
downloads every video."""

from __future__ import annotations

import io
import threading
import time

import pytest
from rich.console import Console

from conftest import require_binaries
from flakyserver import flaky_server, tiny_mp4
from resolverkit import shared
from flows.build import run_build
from flows.services import drain
from pipeline.config import parse_config
from pipeline.download.outage import STOPPED, network_down
from pipeline.compose.status import corpus_status, print_status
from pipeline.compose.status import network_down as status_network_down
from pipeline.corpus.storage import Corpus

pytestmark = pytest.mark.slow


def _server_logs() -> list[str]:
    """Every log line the test's own server holds, once this process has sent its queue."""
    from prefect.client.orchestration import get_client

    drain()
    with get_client(sync_client=True) as client:
        return [entry.message for entry in client.read_logs()]


def test_an_outage_in_the_middle_of_a_build_loses_nothing(tmp_path, prefect_server, monkeypatch, capfd):
    require_binaries("ffmpeg", "ffprobe")
    media = tiny_mp4(tmp_path / "tiny.mp4")
    root = str(tmp_path / "corpus")
    with (shared(tmp_path / "resolver.json", monkeypatch) as names,
          flaky_server(media, p429=0, pdrop=0) as (base, stats)):
        port = base.rsplit(":", 1)[1]
        urls = [f"http://{host}.test:{port}/v/{host}{i}.html" for host in "ab" for i in range(6)]
        cfg = parse_config({
            "name": "outage", "sources": [{"type": "urls", "urls": urls}],
            "download": {"concurrency_limit": "test-outage", "concurrency": 2, "per_host": None,
                         "rate_limit": None, "subtitle_langs": ["en"], "network_threshold": 3,
                         "network_cooldown_s": 0.5, "network_cooldown_max_s": 1, "max_outage_s": 3},
            "execution": {"retry_backoff_s": 0.1, "batch_size": 2, "n_workers": 2,
                          "threads_per_worker": 1, "partitions": 2},
        })

        def outage_after_some_videos() -> None:
            deadline = time.monotonic() + 300
            while stats.requests < 8 and time.monotonic() < deadline:  # ~3 videos
                time.sleep(0.05)
            names.down()

        threading.Thread(target=outage_after_some_videos, daemon=True).start()
        first = run_build(cfg, root=root, until="download")
        # The workers' standard error (the build relays it to its own), and the flow's log.
        said = capfd.readouterr().err.count(STOPPED) + sum(STOPPED in m for m in _server_logs())
        names.up()
        corpus = Corpus(root)
        left = status_network_down(corpus)
        printed = Console(file=io.StringIO(), width=300)
        print_status(corpus_status(corpus, cfg), printed)
        second = run_build(cfg, root=root, until="download")
    report = first["stages"]["download"]
    # A video whose retries ran out before the watch saw the outage keeps a transient row (the
    # next run's work); nothing is judged final.
    assert network_down(report["stopped"]) and report["left"] > 0
    # Both partitions were in flight when the network went, and each stopped: one line for both.
    assert said == 1
    assert set(report["errors"]) <= {"transient"}, report["errors"]
    assert not first["health"]["healthy"]
    assert "the network was down: download stopped" in first["health"]["message"]
    assert left is not None and left["left"] == report["left"]
    assert f"the network was down: the download run of {left['run']} stopped with {left['left']} videos left" \
        in printed.file.getvalue()
    # Nothing was judged: the rerun downloads every video, and no final errors row was written.
    assert second["health"]["healthy"] and second["stages"]["download"]["stopped"] is None
    assert set(corpus.done("downloads")) == set(corpus.done("videos")) and len(corpus.done("videos")) == 12
    assert set(corpus.read("errors").column("kind").to_pylist()) <= {"transient"}
