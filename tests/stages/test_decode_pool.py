"""Frame sampling in worker processes (media.decode_pool): the same frames as sampling in
this process, videos cut into parts for idle workers, workers that die or are abandoned, and
a pool that works where multiprocessing may not start children (a Dask worker is daemonic)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import require_binaries

from pipeline.errors import BadInputError, ErrorKind, StageError
from pipeline.media import FrameRequest, FrameSpec, sample_frames
from pipeline.media import decode_pool
from pipeline.media.decode_pool import DecodePool, Job, plan_jobs, split_requests

SMALL = FrameSpec(fps=2, short_side=96, crop=80)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def videos(tmp_path_factory) -> dict[str, str]:
    """Two 40 s test patterns (keyframe every 2 s), a file that is not a video, one missing."""
    require_binaries("ffmpeg")
    base = tmp_path_factory.mktemp("pool")
    paths = {name: str(base / f"{name}.mp4") for name in ("a", "b", "junk", "missing")}
    for name, source in (("a", "testsrc2"), ("b", "smptebars")):
        subprocess.run(["ffmpeg", "-nostdin", "-v", "error", "-f", "lavfi", "-i",
                        f"{source}=s=192x108:r=25:d=40", "-c:v", "libx264", "-g", "50",
                        "-pix_fmt", "yuv420p", paths[name]], check=True)
    Path(paths["junk"]).write_bytes(np.random.default_rng(0).bytes(20_000))
    return paths


@pytest.fixture
def pool():
    pool = DecodePool(2)
    yield pool
    pool.close()


def _clips(prefix: str, starts: list[float], length: float = 3.0,
           spec: FrameSpec = SMALL) -> list[FrameRequest]:
    return [FrameRequest(f"{prefix}{i}", s, s + length, spec) for i, s in enumerate(starts)]


def test_the_pool_gives_the_frames_sampling_here_gives(videos, pool, monkeypatch):
    monkeypatch.setattr(decode_pool, "MIN_PART_S", 5.0)  # parts, on these short videos
    wanted = {videos["a"]: _clips("a", [x * 1.5 for x in range(24)]),  # overlapping all along
              videos["b"]: _clips("b", [0.5, 4.0, 9.0, 20.0, 33.5, 36.0], length=2.5)}
    jobs = plan_jobs(wanted, 4)
    assert len(jobs) > 2  # the videos were cut into parts
    got = dict(pool.sample(jobs, contextlib.nullcontext, depth=2))
    assert set(got) == {r.key for requests in wanted.values() for r in requests}  # all 30 within the videos
    for path, requests in wanted.items():
        here = dict(sample_frames(path, requests))
        assert set(here) == {r.key for r in requests}
        for key, frames in here.items():
            assert np.array_equal(got[key], frames), key


def test_bad_media_and_failed_fetches_are_errors_of_their_clips(videos, pool):
    jobs = [Job(videos["junk"], tuple(_clips("j", [0.0, 1.0]))),
            Job(videos["missing"], tuple(_clips("m", [0.0]))),
            Job("remote/gone.mp4", tuple(_clips("r", [0.0]))),
            Job(videos["a"], tuple(_clips("late", [38.0]) + _clips("ok", [1.0])))]

    @contextlib.contextmanager
    def localize(media: str):
        if media.startswith("remote/"):
            raise ConnectionResetError("the store reset the connection")
        yield media

    got = dict(pool.sample(jobs, localize, depth=1))
    assert all(isinstance(got[k], BadInputError) for k in ("j0", "j1", "m0", "late0"))
    assert "ends at" in str(got["late0"])
    assert isinstance(got["r0"], StageError) and got["r0"].kind == ErrorKind.TRANSIENT
    assert got["ok0"].shape == (6, 80, 80, 3)


def test_finish_runs_on_each_clip_and_its_failure_is_that_clips_error(videos, pool):
    def finish(frames: np.ndarray) -> int:
        if len(frames) == 4:
            raise ValueError("four is too many")
        return int(frames.sum() % 997)

    jobs = [Job(videos["a"], tuple(_clips("c", [0.0, 5.0]) + _clips("short", [9.0], length=2.0)))]
    got = dict(pool.sample(jobs, contextlib.nullcontext, depth=1,
                           allocate=lambda shape: np.zeros(shape, np.uint8), finish=finish))
    assert isinstance(got["c0"], int) and isinstance(got["c1"], int)
    assert isinstance(got["short0"], BadInputError) and "four is too many" in str(got["short0"])


@pytest.mark.parametrize("sig,kind", [(signal.SIGKILL, ErrorKind.TRANSIENT),
                                      (signal.SIGSEGV, ErrorKind.BAD_INPUT)])
def test_a_worker_that_dies_fails_the_rest_of_its_job_and_is_replaced(videos, pool, sig, kind):
    # Large frames (no crop): the worker blocks on a full pipe long before the job ends.
    big = FrameSpec(fps=10, short_side=108, crop=None)
    jobs = [Job(videos["a"], tuple(_clips("k", [x * 3.0 for x in range(12)], spec=big)))]
    results = pool.sample(jobs, contextlib.nullcontext, depth=1)
    got = dict([next(results)])
    [worker] = pool._workers
    os.kill(worker.proc.pid, sig)
    got.update(results)
    assert set(got) == {f"k{i}" for i in range(12)}
    failed = [v for v in got.values() if isinstance(v, StageError)]
    assert failed and all(f.kind == kind and sig.name in str(f) for f in failed)
    # The next job gets a new worker.
    after = dict(pool.sample([Job(videos["b"], tuple(_clips("n", [1.0])))], contextlib.nullcontext, 1))
    assert after["n0"].shape == (6, 80, 80, 3)


def test_a_consumer_that_stops_early_leaves_the_pool_usable(videos, pool):
    jobs = [Job(videos[v], tuple(_clips(v, [x * 3.0 for x in range(12)]))) for v in ("a", "b")]
    results = pool.sample(jobs, contextlib.nullcontext, depth=1)
    next(results)
    results.close()
    got = dict(pool.sample(jobs, contextlib.nullcontext, depth=4))
    assert len(got) == 24 and all(isinstance(v, np.ndarray) for v in got.values())


def test_split_requests_cuts_between_clips_where_it_can():
    spec = SMALL
    apart = [FrameRequest(f"r{i}", s, s + 3.0, spec) for i, s in enumerate(range(0, 160, 4))]
    parts = split_requests(apart[::-1], 4)
    assert len(parts) == 4 and [r for p in parts for r in p] == apart  # ordered, each once
    # Overlapping clips all along: cut anyway, evenly.
    overlapping = [FrameRequest(f"o{i}", i * 1.5, i * 1.5 + 3.0, spec) for i in range(80)]
    assert [len(p) for p in split_requests(overlapping, 4)] == [20, 20, 20, 20]
    # A gap near the even cut is taken instead of cutting through clips.
    gap = overlapping[:38] + [FrameRequest(f"g{i}", 70.0 + i * 1.5, 73.0 + i * 1.5, spec) for i in range(42)]
    first, second = split_requests(gap, 2)
    assert first[-1].key == "o37" and max(r.end_s for r in first) <= second[0].start_s
    # Short spans are not cut (each part pays a seek); one request is one part.
    assert len(split_requests(apart[:5], 8)) == 1 and split_requests(apart[:1], 8) == [apart[:1]]
    assert split_requests([], 3) == []


DAEMONIC = """
import contextlib, multiprocessing, sys
from pipeline.media import FrameRequest, FrameSpec
from pipeline.media.decode_pool import Job, shared_pool
multiprocessing.current_process().daemon = True  # as a Dask worker under its nanny
try:
    multiprocessing.Process(target=print).start()
    print("multiprocessing started a child")
except AssertionError as exc:
    print("multiprocessing:", exc)
job = Job(sys.argv[1], (FrameRequest("x", 1.0, 3.0, FrameSpec(fps=2, short_side=96, crop=80)),))
[(key, frames)] = shared_pool(2).sample([job], contextlib.nullcontext, 1)
print("pool:", key, frames.shape)
"""


def test_the_pool_works_in_a_daemonic_process(videos):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", DAEMONIC, videos["a"]], capture_output=True,
                          text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "multiprocessing: daemonic processes are not allowed to have children" in done.stdout
    assert "pool: x (4, 80, 80, 3)" in done.stdout
