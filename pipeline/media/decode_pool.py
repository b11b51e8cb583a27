"""Frame sampling (``frames.sample_frames``) in worker processes, so that decoding uses every
core of the machine instead of the one the GIL leaves to Python threads:

    pool = shared_pool(processes, threads)   # started on first use, kept for later batches
    jobs = plan_jobs({path: requests, ...}, pool.size)
    for key, value in pool.sample(jobs, localize, depth, allocate, finish):
        use(key, value)                      # finish(frames), or a StageError for that key

The workers are plain child interpreters (``python -m pipeline.media.decode_pool``), not
multiprocessing: the featurize stage runs inside Dask worker processes, which are daemonic, and
a daemonic process may not start multiprocessing children. A worker reads jobs on its standard
input and writes each request's frames as raw bytes on its standard output, which the parent
reads straight into the array ``allocate`` gives (pinned memory on a GPU machine): no pickling
of frames, one copy into the pipe and one out. One thread per worker in the parent feeds it
jobs and reads its results; a bounded queue per ``sample`` call holds what the consumer has not
taken yet, so memory stays bounded however far decoding could run ahead. A worker ends when its
input closes (the parent ended, however it ended).
"""

from __future__ import annotations

import abc
import atexit
import contextlib
import math
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from pipeline.errors import BadInputError, ErrorKind, StageError, TransientError, classify, error
from pipeline.media.frames import FrameRequest, sample_frames
from pipeline.media.pipes import grow_pipe, read_message, write_message

# A part of a video decoded by one worker covers at least this much of it: each part starts
# with a seek to the keyframe before its first frame, which costs up to one keyframe interval
# of frames nobody wants.
MIN_PART_S = 30.0
_FINISHED = object()  # a job's end, on its call's queue
_CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGABRT, signal.SIGFPE, signal.SIGILL}

Localize = Callable[[str], AbstractContextManager[str]]  # a media path -> a local file path
Allocate = Callable[[tuple[int, ...]], np.ndarray]  # uint8 array of that shape to read into


# Decode processes for a worker that shares the machine's cores with other GPUs' workers (set
# by the local cluster on its GPU workers: the cores per GPU).
DECODE_WORKERS_ENV = "VLCORPUS_DECODE_WORKERS"


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, which containers and taskset set)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


@dataclass(frozen=True)
class Job:
    """Requests of one video (or of one part of it) for one worker."""

    media: str  # as the caller names it; ``localize`` makes it a local file
    requests: tuple[FrameRequest, ...]
    skip_nonref: bool = False  # see frames.sample_frames


def plan_jobs(videos: Mapping[str, Sequence[FrameRequest]], processes: int,
              skip_nonref: bool = False) -> list[Job]:
    """Jobs for ``processes`` workers: a video with requests over a long enough span is cut into
    parts, so a batch of a few long videos still keeps every worker busy; longest spans first,
    so the last to finish are short."""
    parts = max(1, math.ceil(processes / max(1, len(videos))))
    jobs = [Job(media, tuple(part), skip_nonref) for media, requests in videos.items()
            for part in split_requests(requests, parts)]
    return sorted(jobs, key=lambda job: -_span(job.requests))


def split_requests(requests: Sequence[FrameRequest], parts: int) -> list[list[FrameRequest]]:
    """``requests`` of one video in up to ``parts`` runs of about equal size, each spanning at
    least MIN_PART_S. A cut falls where no request overlaps the next run, if there is such a
    place within a quarter run of the even cut: then no frame is decoded or converted for two
    runs. Where requests overlap all along, the frames the two runs share (less than one
    request's length) are decoded by both."""
    ordered = sorted(requests, key=lambda r: (r.start_s, r.end_s))
    parts = min(parts, len(ordered), max(1, int(_span(ordered) // MIN_PART_S)))
    if parts <= 1:
        return [ordered] if ordered else []
    clean, reach = [], ordered[0].end_s  # before request i when every earlier one ends by its start
    for i in range(1, len(ordered)):
        if reach <= ordered[i].start_s:
            clean.append(i)
        reach = max(reach, ordered[i].end_s)
    size = len(ordered) / parts
    bounds = [0]
    for k in range(1, parts):
        even = round(k * size)
        near = [c for c in clean if abs(c - even) <= size / 4 and c > bounds[-1]]
        cut = min(near, key=lambda c: abs(c - even)) if near else even
        if bounds[-1] < cut < len(ordered):
            bounds.append(cut)
    bounds.append(len(ordered))
    return [ordered[a:b] for a, b in zip(bounds, bounds[1:])]


def _span(requests: Sequence[FrameRequest]) -> float:
    return max(r.end_s for r in requests) - min(r.start_s for r in requests) if requests else 0.0


@dataclass
class _Call:
    """One ``sample`` call: its bounded output queue and how it wants results made."""

    out: queue.Queue
    localize: Localize
    allocate: Allocate
    finish: Callable[[Any], Any]
    cancelled: threading.Event = field(default_factory=threading.Event)

    def put(self, entry: object) -> None:
        """Queue ``entry``, unless the consumer has gone: then raise _Cancelled."""
        while not self.cancelled.is_set():
            try:
                self.out.put(entry, timeout=0.1)
                return
            except queue.Full:
                continue
        raise _Cancelled

    def result(self, frames: Any) -> Any:
        """``finish(frames)``, or the error row it makes of them; errors pass through."""
        if isinstance(frames, StageError):
            return frames
        try:
            return self.finish(frames)
        except Exception as exc:  # noqa: BLE001 - these frames' error row, as when decoding failed
            return BadInputError(f"decode failed: {exc}")


class _Cancelled(Exception):
    """The consumer of a call stopped reading."""


class FeederPool(abc.ABC):
    """Threads of this process that run the jobs of ``sample`` calls one after another, each on
    a decoder of its own (a worker process, a GPU decoder). Several calls may run at once:
    their jobs share the feeders."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._jobs: queue.Queue[tuple[_Call, Job] | None] = queue.Queue()
        self._feeders = [threading.Thread(target=self._feed, name=f"{type(self).__name__}-{i}",
                                          daemon=True) for i in range(size)]
        for feeder in self._feeders:
            feeder.start()

    def sample(self, jobs: Sequence[Job], localize: Localize, depth: int,
               allocate: Allocate = lambda shape: np.empty(shape, np.uint8),
               finish: Callable[[Any], Any] = lambda frames: frames,
               ) -> Iterator[tuple[str, Any]]:
        """``(key, finish(frames))`` for every request of ``jobs`` as its frames come in, or
        ``(key, StageError)`` when they cannot be had (``sample_frames``'s errors; the media
        unreadable or not fetched; ``finish`` failing on them). At most ``depth`` results wait
        for the consumer. Stopping early (closing the iterator) cancels what is left."""
        call = _Call(queue.Queue(maxsize=max(1, depth)), localize, allocate, finish)
        for job in jobs:
            self._jobs.put((call, job))
        try:
            left = len(jobs)
            while left:
                got = call.out.get()
                if got is _FINISHED:
                    left -= 1
                else:
                    yield got
        finally:
            call.cancelled.set()

    def close(self) -> None:
        """Feeders end after their job; decoders are stopped now."""
        for _ in self._feeders:
            self._jobs.put(None)

    def _feed(self) -> None:
        try:
            state, broken = self._open(), None
        except Exception as exc:  # noqa: BLE001 - every job of this feeder fails with it, none hangs
            state, broken = None, TransientError(f"the decoder could not start: {exc}")
        while (task := self._jobs.get()) is not None:
            call, job = task
            if call.cancelled.is_set():
                continue
            left = {r.key for r in job.requests}
            try:
                try:
                    if broken is not None:
                        raise broken
                    with call.localize(job.media) as path:
                        for key, value in self._run(state, call, path, job):
                            left.discard(key)
                            call.put((key, value))
                except (_Cancelled, SystemExit, KeyboardInterrupt):
                    raise
                except Exception as exc:  # noqa: BLE001 - e.g. the media could not be fetched
                    failure = exc if isinstance(exc, StageError) else error(*classify(exc))
                    for key in left:
                        call.put((key, failure))
                call.put(_FINISHED)
            except _Cancelled:
                self._abandon(state)

    def _open(self) -> Any:
        """A feeder's own state, made in its thread."""
        return None

    @abc.abstractmethod
    def _run(self, state: Any, call: _Call, path: str, job: Job) -> Iterator[tuple[str, Any]]:
        """``(key, call.result(frames or error))`` per request of ``job``, its media at the local
        ``path``; an exception fails the requests it has not yielded."""

    @abc.abstractmethod
    def _abandon(self, state: Any) -> None:
        """A job was left in the middle (its consumer went away): make ``state`` ready for the
        next one."""


class _Died(StageError):
    """A worker process ended in the middle of a job. Transient unless the decoder crashed:
    a process killed (by the kernel's OOM killer, by hand) says nothing about the file."""

    kind = ErrorKind.TRANSIENT


class _Worker:
    """One decoding process and the pipes to it."""

    def __init__(self, threads: int) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": package_root + (os.pathsep + path if path else "")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.media.decode_pool", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0, env=env)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.send_to: IO[bytes] = self.proc.stdin
        self.read_from: IO[bytes] = self.proc.stdout
        grow_pipe(self.read_from)

    def send(self, message: object) -> None:
        try:
            write_message(self.send_to, message)
        except (OSError, ValueError):  # its end of the pipe is gone (ValueError: closed here)
            raise self._died() from None

    def receive(self) -> Any:
        try:
            message = read_message(self.read_from)
        except (OSError, ValueError):
            message = None
        if message is None:
            raise self._died()
        return message

    def read_into(self, array: np.ndarray) -> None:
        view = memoryview(array).cast("B")
        while len(view):
            try:
                n = self.read_from.readinto(view)
            except (OSError, ValueError):
                n = 0
            if not n:
                raise self._died()
            view = view[n:]

    def _died(self) -> _Died:
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return _Died("the decoding process stopped answering while decoding this video")
        if code >= 0:
            return _Died(f"the decoding process exited with {code} while decoding this video")
        died = _Died(f"the decoding process died of {signal.Signals(-code).name} while decoding "
                     f"this video")
        if -code in _CRASHES:
            died.kind = ErrorKind.BAD_INPUT
        return died

    def stop(self) -> None:
        """Close its input (it exits) and make sure it is gone."""
        for pipe in (self.send_to, self.read_from):
            with contextlib.suppress(OSError):  # a dead worker's pipe may be broken already
                pipe.close()
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclass
class _Slot:
    """A feeder's worker process, started when a job comes (again after it ended)."""

    worker: _Worker | None = None


class DecodePool(FeederPool):
    """``processes`` worker processes sampling frames with ``frames.sample_frames``, with
    ``threads`` decoder threads each (None: one each when the workers fill the machine)."""

    def __init__(self, processes: int, threads: int | None = None) -> None:
        self.threads = threads or max(1, usable_cpus() // processes)
        self._workers: set[_Worker] = set()
        self._lock = threading.Lock()
        super().__init__(processes)

    def close(self) -> None:
        super().close()
        with self._lock:
            workers, self._workers = list(self._workers), set()
        for worker in workers:
            worker.stop()

    def _open(self) -> _Slot:
        return _Slot()

    def _run(self, slot: _Slot, call: _Call, path: str, job: Job) -> Iterator[tuple[str, Any]]:
        if slot.worker is not None and slot.worker.proc.poll() is not None:
            self._abandon(slot)  # it ended while idle
        if slot.worker is None:
            slot.worker = _Worker(self.threads)
            with self._lock:
                self._workers.add(slot.worker)
        worker = slot.worker
        left = {r.key for r in job.requests}
        try:
            worker.send((path, job.requests, job.skip_nonref))
            while left:
                kind, key, detail = worker.receive()
                left.discard(key)
                if kind == "frames":
                    frames = call.allocate(detail)
                    worker.read_into(frames)
                    yield key, call.result(frames)
                else:
                    yield key, error(ErrorKind(kind), detail)
        except _Died:
            self._abandon(slot)
            raise

    def _abandon(self, slot: _Slot) -> None:
        # In the middle of a job nobody reads any more, or dead: the next job starts afresh.
        if slot.worker is not None:
            with self._lock:
                self._workers.discard(slot.worker)
            slot.worker.stop()
            slot.worker = None


_pools: dict[tuple[int, int | None], DecodePool] = {}
_pools_lock = threading.Lock()


def shared_pool(processes: int, threads: int | None = None) -> DecodePool:
    """This process's pool of ``processes`` workers of ``threads`` decoder threads, started on
    first use and kept: a batch after the first starts no process (a worker process starts with
    its first job)."""
    with _pools_lock:
        if (processes, threads) not in _pools:
            _pools[processes, threads] = DecodePool(processes, threads)
        return _pools[processes, threads]


@atexit.register
def _close_pools() -> None:
    with _pools_lock:
        for pool in _pools.values():
            pool.close()
        _pools.clear()


def _serve(threads: int, jobs: IO[bytes], out: IO[bytes]) -> None:
    """The worker's loop: for each job, one message per request (its frames' shape followed by
    their bytes, or its error), until the input ends."""
    while (job := read_message(jobs)) is not None:
        path, requests, skip_nonref = job
        done: set[str] = set()
        try:
            for key, frames in sample_frames(path, requests, threads, skip_nonref):
                done.add(key)
                if isinstance(frames, StageError):
                    write_message(out, (frames.kind.value, key, str(frames)))
                else:
                    write_message(out, ("frames", key, frames.shape))
                    out.write(memoryview(np.ascontiguousarray(frames)).cast("B"))
                    out.flush()
        except Exception as exc:  # noqa: BLE001 - the rest of the job's requests fail with it
            for request in requests:
                if request.key not in done:
                    write_message(out, (ErrorKind.BAD_INPUT.value, request.key, f"decode failed: {exc}"))


def main() -> None:
    # The protocol owns the real standard output; anything else printed goes to standard error.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle
    with contextlib.suppress(BrokenPipeError):  # the parent went away
        _serve(int(sys.argv[1]), sys.stdin.buffer, out)


if __name__ == "__main__":
    main()
