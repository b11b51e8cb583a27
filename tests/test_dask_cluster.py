"""build_corpus on a real multi-process Dask cluster started here: a scheduler and two
workers on 127.0.0.1, one with the resource GPU=1. Featurize tasks must run only there."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import require_binaries
from flows.build import run_build
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.storage import Corpus
from pipeline.validate import validate

pytestmark = pytest.mark.slow
DASK = str(Path(sys.executable).parent / "dask")


@pytest.fixture
def cluster(tmp_path, prefect_server):
    scheduler_file = tmp_path / "scheduler.json"
    common = ["--no-dashboard"]
    procs = [subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", "0",
                               "--scheduler-file", str(scheduler_file), *common])]
    deadline = time.monotonic() + 60
    while not scheduler_file.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    for name, extra in (("cpu", []), ("gpu", ["--resources", "GPU=1"])):
        procs.append(subprocess.Popen([DASK, "worker", "--scheduler-file", str(scheduler_file),
                                       "--name", name, "--nthreads", "1", "--nworkers", "1",
                                       "--host", "127.0.0.1", *common, *extra]))
    address = json.loads(scheduler_file.read_text())["address"]
    from distributed import Client

    with Client(address, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
    yield address
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        proc.wait(timeout=30)


def test_build_on_a_cluster_with_a_gpu_worker(demo_corpus, tmp_path, cluster):
    require_binaries("ffmpeg", "ffprobe")
    _, site = demo_corpus
    with serve_demo(site) as base:
        urls = tmp_path / "urls.txt"
        urls.write_text(f"{base}pages/tour-0.html\n{base}pages/tour-1.html\n{base}pages/gone.html\n")
        cfg = parse_config({
            "name": "cluster", "sources": [{"type": "list", "path": str(urls)}],
            "transcribe": {"prefer": ["manual"]},
            "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}],
                         "clips_per_commit": 4},
            "execution": {"batch_size": 1, "gpu_resource": True, "retry_backoff_s": 0},
        })
        summary = run_build(cfg, root=str(tmp_path / "corpus"), until="featurize",
                            dask_address=cluster)
    stages = summary["stages"]
    assert stages["featurize:resnet34"]["workers"] == ["gpu"]
    assert stages["featurize:resnet34"]["ok"] == summary["tables"]["clips"] > 0
    assert set(stages["download"]["workers"]) <= {"cpu", "gpu"}
    assert summary["errors"] == {"download": {"permanent": 1}}
    assert validate(Corpus(str(tmp_path / "corpus"))) == []
