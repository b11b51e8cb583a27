"""Jobs that follow the work: how many SLURM jobs each pool holds, decided from the scheduler's
own tasks, on the cluster's event loop.

dask's ``adapt`` counts workers, not resources: it retires GPU workers as idle while GPU tasks
wait for a worker that offers GPU=1, or starts too few for them (dask-jobqueue#230, #304), and
between two waves of work it releases every worker, so that each wave waits in the queue again
(#701). Here each pool counts its own tasks: those that ask for GPU=1 are the GPU pool's, the
rest the CPU pool's.

- A pool holds enough jobs for its tasks that can run or are running, up to its ``max_jobs``;
  tasks that still wait on others are not counted (their chain's earlier stage holds a job).
- A CPU job goes once it has been idle ``idle_s`` and no CPU task is about to be able to run (one
  whose inputs are being computed: the align after a partition's GPU transcription), so the
  next step of a chain, or a wave that follows soon, finds it; after ``HOLD_IDLE`` times
  ``idle_s`` idle it goes in any case.
- A GPU job goes as soon as no GPU task can run, unless one is about to and the job has been
  idle less than a job takes to start: leaving and coming back would cost that much idle GPU
  again.
- Pending jobs are the first to go: nothing has run on them.
- A job goes by retiring its workers through the scheduler, which first copies the results they
  hold to other workers; a job whose workers hold results and no other worker to take them
  stays: its results would be lost, and the tasks that made them run again.

Each tick also reads the queue (``squeue``) while a job has no worker yet, for the progress line
("2 GPU jobs pending (Resources)") and to tell a job that cannot start (it ended before its
worker joined) from one that is slow to: the third in a row of one pool fails the build, with
the job's own last words.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import shlex
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("vlcorpus.slurm")

# Seconds between two looks at the scheduler's tasks, and at the queue while a job waits.
TICK_S = 1.0
QUEUE_EVERY_S = 2.0
# Jobs of one pool in a row that ended before their worker joined, after which the build fails.
FAILED_STARTS = 3
# Before a job of the pool has started, the seconds a job is taken to take to start.
STARTUP_GUESS_S = 10.0
# An idle CPU job that a task is about to need stays at most this many times idle_s.
HOLD_IDLE = 10
# squeue's states of a job that is over.
ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
         "PREEMPTED", "REVOKED", "SPECIAL_EXIT", "TIMEOUT"}


@dataclass
class Pool:
    """A kind of job: its worker spec (dask-jobqueue's job class and options), how many tasks a
    job runs at once, and its limits."""

    name: str
    spec: dict[str, Any]
    job_name: str
    slots: int
    max_jobs: int
    idle_s: float
    gpu: bool
    log_dir: Path
    failed_starts: int = 0
    startups: list[float] = field(default_factory=list)

    def startup_s(self) -> float:
        """How long this pool's jobs took from running to a worker that joined."""
        return sum(self.startups) / len(self.startups) if self.startups else STARTUP_GUESS_S


@dataclass
class Job:
    """One submitted job, by the worker spec's name (``cpu-3``)."""

    name: str
    pool: Pool
    submitted: float = field(default_factory=time.monotonic)
    job_id: str | None = None
    state: str = "PENDING"
    reason: str = ""
    running_since: float | None = None
    joined: bool = False
    idle_since: float | None = None
    holds: bool = False  # its workers hold results in memory


class Scaler:
    """The pools of ``cluster`` (a dask-jobqueue cluster whose worker specs this owns), scaled
    each tick. ``failure``: why the build cannot go on (a job that cannot start), for the flow to
    raise; ``status()``: the jobs in a line."""

    def __init__(self, cluster: Any, pools: list[Pool]) -> None:
        self.cluster = cluster
        self.pools = {pool.name: pool for pool in pools}
        self.jobs: dict[str, Job] = {}
        self.failure: str | None = None
        self._last_queue = 0.0
        self._numbers = Counter[str]()
        self._task: asyncio.Task | None = None
        self._stopping = False

    # -- on the cluster's loop ------------------------------------------------------------

    async def run(self) -> None:
        while not self._stopping:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - one bad look must not end the scaling
                log.exception("scaling the SLURM pools failed once; trying again")
            await asyncio.sleep(TICK_S)

    async def tick(self) -> None:
        scheduler = self.cluster.scheduler
        now = time.monotonic()
        self._see_workers(scheduler, now)
        if any(not job.joined for job in self.jobs.values()) and now - self._last_queue >= QUEUE_EVERY_S:
            self._last_queue = now
            await self._read_queue(now)
        if self.failure is not None:
            return
        demand, imminent = pool_demand(scheduler)
        for pool in self.pools.values():
            await self._scale(pool, demand[pool.name], imminent[pool.name], now)

    def _see_workers(self, scheduler: Any, now: float) -> None:
        """Which jobs have workers, which of those are busy, and which hold results."""
        busy: dict[str, bool] = {}
        holds: dict[str, bool] = {}
        for ws in scheduler.workers.values():
            name = job_of(str(ws.name), self.jobs)
            if name is not None:
                busy[name] = busy.get(name, False) or bool(ws.processing)
                holds[name] = holds.get(name, False) or bool(ws.has_what)
        for job in list(self.jobs.values()):
            job.holds = holds.get(job.name, False)
            if job.name in busy:
                if not job.joined:
                    job.joined, job.state = True, "RUNNING"
                    job.pool.startups.append(now - (job.running_since or job.submitted))
                    job.pool.failed_starts = 0
                    log.info("SLURM job %s (%s) joined", job.job_id, job.name)
                job.idle_since = None if busy[job.name] else (job.idle_since or now)
            elif job.joined:
                # Its workers left: walltime, preemption, scancel. Their tasks go back to the
                # scheduler, and the pool submits another job if they need one.
                log.warning("SLURM job %s (%s) left; its tasks are handed on", job.job_id, job.name)
                self._forget(job)

    async def _read_queue(self, now: float) -> None:
        names = ",".join(pool.job_name for pool in self.pools.values())
        try:
            out = await _call(["squeue", "-h", "--me", "--states=all", f"--name={names}", "-o", "%i|%T|%r"])
        except RuntimeError as exc:
            log.warning("squeue failed: %s", exc)
            return
        states = {}
        for line in out.splitlines():
            job_id, state, reason = (line.split("|") + ["", ""])[:3]
            states[job_id.strip()] = (state.strip(), reason.strip())
        for job in list(self.jobs.values()):
            if job.job_id is None or job.job_id not in states:
                continue
            state, reason = states[job.job_id]
            if state == "RUNNING" and job.running_since is None:
                job.running_since = now
            if not job.joined:
                job.state, job.reason = state, "" if reason in ("None", "(null)") else reason
            if state in ENDED and not job.joined:
                self._ended_before_joining(job, state)

    def _ended_before_joining(self, job: Job, state: str) -> None:
        pool = job.pool
        # Cancelled or preempted by someone else: no sign that the pool's jobs cannot start.
        pool.failed_starts += state not in ("CANCELLED", "PREEMPTED")
        words = last_words(pool.log_dir, pool.job_name, job.job_id)
        message = (f"SLURM job {job.job_id} of the {pool.name} pool ended ({state}) before its "
                   f"worker started" + (f": {words}" if words else ""))
        log.info("%s", message)  # the build's error if it is the pool's last try
        self._forget(job)
        if pool.failed_starts >= FAILED_STARTS:
            self.failure = message

    async def _scale(self, pool: Pool, tasks: int, imminent: bool, now: float) -> None:
        jobs = [job for job in self.jobs.values() if job.pool is pool]
        want = min(pool.max_jobs, math.ceil(tasks / pool.slots))
        if want > len(jobs):
            await self._submit(pool, want - len(jobs))
        elif want < len(jobs):
            # Pending jobs first (nothing ran on them), then the longest idle.
            idle = sorted((job for job in jobs if self._may_go(job, pool, imminent, now)),
                          key=lambda job: (job.joined, job.idle_since or now))
            for job in idle[:len(jobs) - want]:
                await self._release(job)

    def _may_go(self, job: Job, pool: Pool, imminent: bool, now: float) -> bool:
        if not job.joined:
            return True
        if job.idle_since is None:
            return False
        if job.holds and not any(other.joined for other in self.jobs.values() if other is not job):
            return False
        idle = now - job.idle_since
        if pool.gpu:
            return not imminent or idle >= pool.startup_s()
        return idle >= pool.idle_s * (HOLD_IDLE if imminent else 1)

    async def _submit(self, pool: Pool, n: int) -> None:
        new = []
        for _ in range(n):
            name = f"{pool.name}-{self._numbers[pool.name]}"
            self._numbers[pool.name] += 1
            self.cluster.worker_spec[name] = pool.spec
            new.append(Job(name, pool))
        refused = None
        try:
            await self.cluster._correct_state()
        except RuntimeError as exc:
            refused = sbatch_error(str(exc))
        for job in new:
            job.job_id = getattr(self.cluster.workers.get(job.name), "job_id", None)
            if job.job_id is None:  # sbatch refused it
                self.cluster.worker_spec.pop(job.name, None)
                self.cluster.workers.pop(job.name, None)
                continue
            self.jobs[job.name] = job
            log.info("SLURM job %s (%s) submitted", job.job_id, job.name)
        if refused is not None:
            log.warning("sbatch refused a job of the %s pool: %s", pool.name, refused)
            # Refused with none of the pool's jobs alive, the pool's tasks can never run; with
            # some (a limit on jobs at once), they go on with those.
            if not any(job.pool is pool for job in self.jobs.values()):
                self.failure = f"sbatch refused a job of the {pool.name} pool: {refused}"

    async def _release(self, job: Job) -> None:
        workers = [str(ws.name) for ws in self.cluster.scheduler.workers.values()
                   if job_of(str(ws.name), {job.name: job}) is not None]
        if workers:
            retired = await self.cluster.scheduler.retire_workers(names=workers, close_workers=False, remove=True)
            if len(retired) < len(workers):  # results nobody else could take: the job stays
                return
        log.info("SLURM job %s (%s) released", job.job_id, job.name)
        self._forget(job)
        await self.cluster._correct_state()

    def _forget(self, job: Job) -> None:
        self.jobs.pop(job.name, None)
        self.cluster.worker_spec.pop(job.name, None)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self.run())

    async def stop(self) -> None:
        self._stopping = True
        if self._task is not None:
            await self._task

    # -- from any thread ------------------------------------------------------------------

    def status(self) -> str:
        """The pools' jobs in a line: "SLURM: 1 CPU job running, 2 GPU jobs pending (Resources)"."""
        parts = []
        for pool in self.pools.values():
            jobs = [job for job in list(self.jobs.values()) if job.pool is pool]
            running = sum(job.joined for job in jobs)
            waiting = [job for job in jobs if not job.joined]
            label = pool.name.upper()
            if running:
                parts.append(f"{running} {label} job{'s' * (running != 1)} running")
            if waiting:
                reasons = sorted({job.reason for job in waiting if job.reason})
                starting = sum(job.state == "RUNNING" for job in waiting)
                pending = len(waiting) - starting
                if pending:
                    parts.append(f"{pending} {label} job{'s' * (pending != 1)} pending"
                                 + (f" ({', '.join(reasons)})" if reasons else ""))
                if starting:
                    parts.append(f"{starting} {label} job{'s' * (starting != 1)} starting")
        return "SLURM: " + (", ".join(parts) if parts else "no jobs")


def pool_demand(scheduler: Any) -> tuple[Counter[str], Counter[str]]:
    """Per pool, the tasks that can run or are running; and whether a task of the pool is about
    to be able to (all it waits on is being computed or done)."""
    demand: Counter[str] = Counter()
    imminent: Counter[str] = Counter()
    for ts in list(scheduler.unrunnable) + list(scheduler.queued):
        demand[_pool_of(ts)] += 1
    for ws in scheduler.workers.values():
        for ts in ws.processing:
            demand[_pool_of(ts)] += 1
    for ts in scheduler.tasks.values():
        if ts.state == "waiting" and all(dep.state in ("processing", "memory") for dep in ts.dependencies):
            imminent[_pool_of(ts)] += 1
    return demand, imminent


def _pool_of(ts: Any) -> str:
    return "gpu" if (ts.resource_restrictions or {}).get("GPU") else "cpu"


def job_of(worker: str, jobs: dict[str, Any]) -> str | None:
    """The job a worker belongs to: its name is the job's (``cpu-3``), or the job's and its
    place in the job (``cpu-3-1``) when a job runs several."""
    if worker in jobs:
        return worker
    head, _, tail = worker.rpartition("-")
    return head if tail.isdigit() and head in jobs else None


def last_words(log_dir: Path, job_name: str, job_id: str | None) -> str:
    """The last line a job wrote to its standard error, else to its output ('' if none)."""
    for suffix in ("err", "out"):
        path = log_dir / f"{job_name}-{job_id}.{suffix}"
        try:
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            continue
        if lines:
            return lines[-1][:300]
    return ""


def sbatch_error(text: str) -> str:
    """SLURM's own words in a failed sbatch's output: its last "sbatch: error:" line."""
    errors = re.findall(r"sbatch: error: (.+)", text)
    if errors:
        return errors[-1].strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else text.strip()


async def _call(command: list[str]) -> str:
    proc = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(command)}: {err.decode().strip()}")
    return out.decode()
