"""build_corpus on a real multi-process Dask cluster started here: a scheduler and two
workers on 127.0.0.1, one with the resource GPU=1. Featurize tasks must run only there."""

from __future__ import annotations

import pytest

from conftest import dask_cluster, require_binaries
from flows.build import run_build
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path, prefect_server):
    with dask_cluster(tmp_path, [("cpu", []), ("gpu", ["--resources", "GPU=1"])]) as (address, _):
        yield address


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
            "frames": {"short_side": 64, "crop": 56},
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
