"""Faults never lose data: SIGKILL at random points of a build and of `vlcorpus build` at
several stages, a disk that fills up or refuses writes while a batch is committed, and a Dask
worker killed mid-task.

The random-kill test drives the real stages in order without Prefect (the same calls the stage
flows make, minus the orchestration), so that each kill costs seconds and many seeds fit in
the suite; its kills land at random points of the build's own progress (after a random number
of its commits, then a random moment), never in its imports or after its end. The
several-points test kills the whole `vlcorpus build` process group, Prefect server and Dask
workers included, at each stage. Both rerun the killed root and compare it with one clean build
of the same config, made once for the module (a build costs CPU-seconds before it does any
work). At the end of the session pytest prints "fault points tried: N, mismatched rebuilds: M":
the kills and failed writes that landed, and the rebuilds (or resumed runs) that differed from
what a clean run gives, each of which also fails its test.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, dask_cluster, require_binaries, vlcorpus
from sitekit import copy_site, spread_pages
from tablekit import tables
from pipeline.download import stage as download
from pipeline.config import parse_config
from pipeline.demo import serve_demo
from pipeline.discover import discover
from pipeline.runner import run_stage
from pipeline.compose.stages import context
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow
SEEDS = range(2)
KILLS_PER_SEED = 3

# Every stage in build order, as the stage flows run them, in one process, which names in the
# file of its third argument each table file and shard it commits, once renamed into place.
DRIVER = """
import contextlib, os, sys
from pipeline.config import load_config
from pipeline.graph import ORDER
from pipeline.compose.stages import context, run_local
from pipeline.corpus.storage import Corpus

atomic_file = Corpus.atomic_file
report = os.open(sys.argv[3], os.O_WRONLY | os.O_APPEND)

@contextlib.contextmanager
def reported(self, relpath, mode="wb"):
    with atomic_file(self, relpath, mode) as handle:
        yield handle
    if relpath.endswith((".parquet", ".tar")):
        os.write(report, (relpath + "\\n").encode())  # one write a line, from any thread

Corpus.atomic_file = reported
cfg = load_config(sys.argv[1])
ctx = context(Corpus(sys.argv[2]), cfg)
for name in ORDER:
    run_local(name, ctx)
"""


def _config(path: Path, urls: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "faults",
        "sources": [{"type": "list", "path": str(urls)}],
        "download": {"subtitle_langs": ["en", "en-auto"]},
        "transcribe": {"prefer": ["manual"]},
        "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}],
                     "clips_per_commit": 2},
        # Small frames: what a kill and a rerun must keep equal is the same at any size.
        "frames": {"short_side": 64, "crop": 56},
        "shards": {"samples_per_shard": 3},
        # n_workers: the Dask workers of `vlcorpus build` (the driver has none).
        "execution": {"batch_size": 1, "n_workers": 1, "retry_backoff_s": 0},
    }))
    return path


def _start(config: Path, root: Path, report: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(config), str(root), str(report)],
                            env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _commits(root: Path) -> frozenset[tuple[str, int]]:
    """Every committed table file and shard under ``root`` (name and time): a commit adds one."""
    found = set()
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            if name.endswith((".parquet", ".tar")) and not name.startswith("."):
                path = os.path.join(folder, name)
                with contextlib.suppress(FileNotFoundError):  # a compaction removed it meanwhile
                    found.add((path, os.stat(path).st_mtime_ns))
    return frozenset(found)


def _watched(config: Path, root: Path, kill_after: int | None = None,
             rng: random.Random | None = None) -> tuple[int, bool]:
    """The driver on ``root``, its commits counted as it reports them (a count that no load on
    the machine changes: looking at the files missed those that a compaction soon removed, more
    of them the less often a busy machine let it look); with ``kill_after``, SIGKILLed a random
    moment (up to 0.3 s) after its ``kill_after``-th. Returns (commits reported, whether the
    kill landed: the process was still running). A build that ends first must succeed."""
    with tempfile.NamedTemporaryFile("rb", prefix="commits-", suffix=".txt") as report:
        proc = _start(config, root, Path(report.name))
        made, landed = 0, False
        while proc.poll() is None:
            made += report.read().count(b"\n")
            if kill_after is not None and made >= kill_after:
                time.sleep(rng.uniform(0, 0.3))
                landed = proc.poll() is None
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                break
            time.sleep(0.05)
        else:
            assert proc.returncode == 0, proc.stderr.read()[-3000:]
        return made + report.read().count(b"\n"), landed


def shard_bytes(root: Path) -> dict[str, bytes]:
    base = root / "shards"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file() and not p.name.startswith(".")}


@pytest.fixture(scope="module")
def served(demo_corpus, tmp_path_factory):
    """The demo site on one server for the whole module (page URLs are part of video ids),
    the build config, and one clean build with the number of its commits. The clean build runs
    the stages without Prefect; a clean `vlcorpus build` of the config has the same tables and
    shard files, byte for byte."""
    _, site = demo_corpus
    base_dir = tmp_path_factory.mktemp("faults")
    with serve_demo(site) as base:
        urls = base_dir / "urls.txt"
        urls.write_text("".join(f"{base}pages/{p}\n"
                                for p in ("tour-0.html", "tour-1.html", "gone.html", "broken.html")))
        config = _config(base_dir / "build.yaml", urls)
        clean = base_dir / "clean"
        commits, _ = _watched(config, clean)
        yield config, clean, commits


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_at_random_points_then_rerun_equals_clean_build(served, tmp_path, seed, tally):
    config, clean, commits = served
    count = tally("fault points", "tried", "mismatched rebuilds")
    rng = random.Random(seed)
    root = tmp_path / "killed"
    # Kill points among the clean build's commits, before its last fifth: the killed runs
    # together commit at least as many (what a kill lost is committed again), so each point is
    # reached before the build is done, with room for a commit made as the kill landed, which
    # its run had no time to report.
    points = sorted(rng.sample(range(1, int(0.8 * commits)), KILLS_PER_SEED))
    made = 0
    for point in points:
        seen, landed = _watched(config, root, kill_after=max(1, point - made), rng=rng)
        made += seen
        count.add("tried", int(landed))
        assert landed, f"the run ended before its kill after {point} of {commits} commits"
    _watched(config, root)
    same = tables(root) == tables(clean) and shard_bytes(root) == shard_bytes(clean)
    count.add("mismatched rebuilds", int(not same))
    assert tables(root) == tables(clean)
    assert shard_bytes(root) == shard_bytes(clean)
    assert validate(Corpus(str(root))) == []


def _vlcorpus_build(config: Path, root: Path) -> subprocess.Popen:
    """`vlcorpus build` in a process group of its own: its Prefect server, fork server and Dask
    workers are killed with it."""
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "build", str(config),
                             "--root", str(root), "--quiet"],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, folder: Path) -> bool:
    """SIGKILL the build's process group once ``folder`` has a committed file; False when the
    build ended first."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if _commits(folder):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.05)
    proc.wait()
    return False


def test_sigkill_at_several_points_then_rerun_equals_clean_build(served, tmp_path, tally):
    """`vlcorpus build` (the whole process group: flow, Prefect server, Dask workers) killed once
    each of four stages has committed its first batch, each time resuming the root the last one
    left, then run to the end: tables and shards equal the clean build, `vlcorpus validate`
    passes."""
    config, clean, _ = served
    count = tally("fault points", "tried", "mismatched rebuilds")
    killed = tmp_path / "killed"
    kills = []
    for folder in ("downloads", "segments", "features/resnet34", "shards/webdataset"):
        proc = _vlcorpus_build(config, killed)
        if _kill_when(proc, killed / folder):
            kills.append(folder)
            count.add("tried")
    assert len(kills) >= 3, kills
    proc = _vlcorpus_build(config, killed)
    assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]

    same = tables(killed) == tables(clean) and shard_bytes(killed) == shard_bytes(clean)
    count.add("mismatched rebuilds", int(not same))
    assert tables(killed) == tables(clean)
    # Every shard file of both formats and their indexes, byte for byte.
    assert shard_bytes(killed) == shard_bytes(clean)
    result = vlcorpus("validate", str(killed))
    assert result.returncode == 0, result.stderr


class _FailingWrites:
    """Makes the corpus filesystem's writes under ``table`` fail with ``code`` from the
    ``after``-th file on: the disk filled up, or the directory stopped accepting writes."""

    def __init__(self, monkeypatch, fs, table: str, code: int, after: int) -> None:
        self.table, self.code, self.left, self.refused = table, code, after, 0
        self._open = fs.open
        monkeypatch.setattr(fs, "open", self.open)

    def open(self, path, mode="rb", **kwargs):
        if "w" in mode and f"/{self.table}/" in str(path):
            if self.left == 0:
                self.refused += 1
                raise OSError(self.code, os.strerror(self.code), str(path))
            self.left -= 1
        return self._open(path, mode, **kwargs)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EACCES], ids=["disk-full", "permission-denied"])
def test_failed_batch_write_commits_nothing_and_keeps_earlier_batches(demo_corpus, tmp_path, code, tally,
                                                                     monkeypatch):
    require_binaries("ffmpeg", "ffprobe")
    _, site = demo_corpus
    count = tally("fault points", "tried", "mismatched rebuilds")
    with serve_demo(site) as base:
        urls = [f"{base}pages/tour-{i}.html" for i in range(2)] + [f"{base}pages/gone.html"]
        cfg = parse_config({"name": "full", "sources": [{"type": "urls", "urls": urls}],
                            "download": {"subtitle_langs": ["en"]},
                            "execution": {"batch_size": 1, "retry_backoff_s": 0}})
        ctx = context(Corpus(str(tmp_path / "corpus")), cfg)
        discover(ctx)
        with monkeypatch.context() as patch, pytest.raises(OSError) as raised:
            failing = _FailingWrites(patch, ctx.corpus.fs, "downloads", code, after=1)
            run_stage(download.STAGE, ctx, batch_size=1)
        count.add("tried", failing.refused)
        # The error names the cause and the file; nothing half-written is visible.
        assert raised.value.errno == code and "downloads" in str(raised.value)
        assert failing.refused == 1
        corpus = ctx.corpus
        earlier = corpus.read("downloads").to_pylist()
        assert len(earlier) == len(corpus.done("downloads")) == 1
        failed_before = corpus.read("errors").num_rows
        leftovers = [p for p in (tmp_path / "corpus" / "downloads").rglob(".*")]
        assert leftovers == []
        # With space (or rights) back, the rerun finishes exactly what was left.
        again = run_stage(download.STAGE, ctx, batch_size=1)
    rows = corpus.read("downloads").to_pylist()
    resumed = {
        "the rerun ran what was left": again.items == 3 - 1 - failed_before
        and again.ok + sum(again.errors.values()) == again.items,
        "each video downloaded once": len(rows) == len(corpus.done("downloads")) == 2,
        "the earlier batch kept": [r for r in rows if r["video_id"] == earlier[0]["video_id"]] == earlier,
        "the gone page a permanent error": corpus.read("errors").column("kind").to_pylist() == ["permanent"],
        "the corpus valid": validate(corpus) == [],
    }
    count.add("mismatched rebuilds", int(not all(resumed.values())))
    assert all(resumed.values()), [check for check, held in resumed.items() if not held]


def test_dask_worker_killed_mid_task_build_completes(demo_corpus, tmp_path, prefect_server, tally):
    require_binaries("ffmpeg", "ffprobe")
    from flows.build import run_build

    site = copy_site(demo_corpus, tmp_path)
    count = tally("fault points", "tried", "mismatched rebuilds")
    with dask_cluster(tmp_path, [("victim", []), ("survivor", [])]) as (address, workers), \
            serve_demo(site) as base:
        cfg = parse_config({
            "name": "workerkill",
            # One tour in each partition, whatever the port.
            "sources": [{"type": "urls", "urls": spread_pages(site, base, 2, 2)}],
            "transcribe": {"prefer": ["manual"]},
            "features": {"extractors": [{"name": "resnet34", "fps": 2, "weights": "none"}],
                         "clips_per_commit": 1},
            # One video per partition, both partitions in flight: each worker featurizes one.
            "execution": {"batch_size": 1, "retry_backoff_s": 0, "partitions": 2},
        })
        root = tmp_path / "corpus"
        result: dict = {}
        build = threading.Thread(target=lambda: result.update(
            run_build(cfg, root=str(root), until="featurize", dask_address=address)))
        build.start()
        # Kill one worker (its nanny too, so it is gone for good) while featurize batches,
        # which take seconds each, are running on both workers.
        features = root / "features" / "resnet34"
        deadline = time.monotonic() + 300
        while build.is_alive() and time.monotonic() < deadline:
            if features.exists() and any(features.rglob("*.parquet")):
                os.killpg(workers["victim"].pid, signal.SIGKILL)
                count.add("tried")
                break
            time.sleep(0.02)
        build.join(timeout=600)
    assert not build.is_alive() and result, "the build did not finish"
    corpus = Corpus(str(root))
    clips = corpus.read("clips").num_rows
    complete = result["stages"]["featurize:resnet34"]["errors"] == {} and \
        len(corpus.done("features/resnet34")) == clips > 0
    count.add("mismatched rebuilds", int(not complete))
    assert workers["victim"].poll() is not None
    assert "survivor" in result["stages"]["featurize:resnet34"]["workers"]
    assert complete, result["stages"]
    assert validate(corpus) == []
    assert json.dumps(result["errors"]) == "{}"
