"""Block storms as real sites show them, on the default backend: no Prefect server configured,
so each build runs on a temporary server of its own and keeps its download limits and breaker
on its Dask cluster (flows/cluster_limits.py), whose worker processes share them through the
scheduler. Real yt-dlp against a local site that refuses the session for a while:

- HTTP 429 to every request for longer than the first pause (the breaker trips again and again);
- HTTP 403 to every request, across videos (a 403 alone is weak: it takes several videos);
- a 429 block that ends, then comes back (a second block in the same build).

Each storm trips the breaker at least twice in the first build (the 429 storm at least three
times), no video is failed for good, and a second build downloads every video.
"""

from __future__ import annotations

import time

import pytest

from conftest import require_binaries
from flakyserver import Block, flaky_server, tiny_mp4
from flows.build import run_build
from pipeline.config import parse_config
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("builds_fork_server")]

VIDEOS = 12


@pytest.fixture(scope="module")
def temporary_server():
    """Builds in this module run as the CLI runs them with no server configured."""
    from flows.services import on_temporary_server, prefect_server

    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("PREFECT_API_URL", raising=False)
        with prefect_server() as up:
            up()
            assert on_temporary_server()
            yield


@pytest.fixture(scope="module")
def media(tmp_path_factory) -> bytes:
    require_binaries("ffmpeg", "ffprobe")
    return tiny_mp4(tmp_path_factory.mktemp("media") / "tiny.mp4")


STORMS = {
    # ~4 requests a video: the storm begins at the second video and outlasts several pauses.
    "429 longer than the first pause": (Block(after=4, seconds=10.0, code=429), 3),
    "403 across videos": (Block(after=4, seconds=10.0, code=403), 2),
    "429 that comes back": (Block(after=4, seconds=4.0, code=429, again_after=3.0), 2),
}


@pytest.mark.parametrize("storm", list(STORMS))
def test_a_block_storm_on_the_default_backend_loses_no_video(storm, media, tmp_path, temporary_server):
    block, trips = STORMS[storm]
    root = tmp_path / "corpus"
    with flaky_server(media, p429=0, pdrop=0, block=block) as (base, _):
        cfg = parse_config({
            "name": "storm", "sources": [{"type": "urls", "urls": [f"{base}/v/{i:02d}.html" for i in range(VIDEOS)]}],
            "download": {"concurrency": 2, "per_host": None, "rate_limit": None, "max_block_s": 120,
                         "block_threshold": 2, "block_cooldown_s": 1, "block_cooldown_max_s": 2},
            # Two worker processes, batches of two: several partitions download at once.
            "execution": {"batch_size": 2, "n_workers": 2, "threads_per_worker": 1,
                          "partitions": 4, "retry_backoff_s": 0.1},
        })
        first = run_build(cfg, root=str(root), until="download")["stages"]["download"]
        time.sleep(max(0.0, (block.ends or 0) - time.monotonic()))
        second = run_build(cfg, root=str(root), until="download")["stages"]["download"]
    corpus = Corpus(str(root))
    kinds = {e["kind"] for e in corpus.read("errors").to_pylist()}
    assert block.refused > 0 and len(first["workers"]) == 2
    assert first["figures"]["pauses"] >= trips, first["figures"]
    # Refused videos waited out the pauses or were left to do: none failed for good, none
    # failed on a bug of ours, and the second build downloaded the rest.
    assert kinds <= {"blocked"}, kinds
    assert not first["stopped"] and second["skipped_failed"] == 0
    assert first["ok"] + second["ok"] == VIDEOS
    assert set(corpus.done("downloads")) == set(corpus.done("videos"))
    assert validate(corpus) == []
