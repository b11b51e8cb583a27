"""The partition passes of a build: every stage of a list over every partition with work, on
the Dask cluster, either pipelined (a chain per partition, at most
``execution.max_inflight_partitions`` chains at once, each one Prefect task, or one for each
run of stages that go to the same kind of worker) or a stage over all partitions before the next
(a task per stage and partition); with the build's progress shown as tasks finish, and each
stage's totals (counts, wall and task seconds, workers) at the end.
"""

from __future__ import annotations

import queue
import time
from dataclasses import asdict
from typing import Any

import dask
from distributed import Client
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect_dask import DaskTaskRunner

from flows import clusters
from flows.cluster_limits import cluster_backend
from flows.build_progress import BuildProgress, show_cluster
from flows.services import on_temporary_server
from flows.shared import PREFECT
from pipeline.download import limits
from pipeline.corpus import retention
from pipeline.config import Config
from pipeline.errors import SetupError
from pipeline.runner import StageContext, StageReport, run_partition
from pipeline.shards.stage import listing_report
from pipeline.compose.stages import context, gpu_stages, parts
from pipeline.compose.status import Counts, idle_partitions
from pipeline.corpus.storage import Corpus
from pipeline.compose.summarize_partition import store_summary


@task(name="partition-stages", retries=2, retry_delay_seconds=[2, 10], cache_policy=NO_CACHE,
      persist_result=False)
def partition_task(stage_names: list[str], partition: str, root: str, cfg: Config,
                   retry_failed: bool, limits_on: str, last: bool = False) -> list[dict[str, Any]]:
    """Stages of one partition's chain in turn, one Prefect task for all of them (a task run's
    own cost, its state changes and its worker's Prefect context, is most of a chain's when a
    night adds a few videos to a partition); returns each stage's report. ``limits_on``: where
    the tasks share download limits, "prefect" or "cluster" (see ``where_limits``). The
    ``last`` task of a partition's chain stores the partition's summary. A retry runs the
    stages again, each planning its partition again: what was committed stays done."""
    ctx = context(Corpus(root), cfg)
    with limits.using(backend(limits_on)):
        results = [_stage(name, partition, ctx, retry_failed) for name in stage_names]
    if last:
        store_summary(ctx, partition)
    return results


def _stage(stage_name: str, partition: str, ctx: StageContext, retry_failed: bool) -> dict[str, Any]:
    """Every part of one stage over one partition (featurize: each extractor in turn); the
    shard stage then drops the partition's media unless ``storage.keep_media``."""
    started, began = time.monotonic(), time.time()
    cfg: Config = ctx.config
    reports = {}
    for part in parts(stage_name, cfg):
        size = part.batch_size or cfg.execution.batch_size
        report = run_partition(part, ctx, partition, size, retry_failed)
        if report.total:
            get_run_logger().info(report.plan_line(part.name, partition))
        reports[part.name] = asdict(report)
    released = 0
    if stage_name == "shard" and not cfg.storage.keep_media:
        released = retention.release(ctx, partition)
    return {"stage": stage_name, "partition": partition, "parts": reports, "released": released,
            "worker": _worker_name(), "seconds": time.monotonic() - started, "began": began}


@task(name="shard-listing", cache_policy=NO_CACHE, persist_result=False)
def listing_task(root: str, cfg: Config, written: int) -> dict[str, Any]:
    return listing_report(Corpus(root), cfg, written)


def _worker_name() -> str:
    """The Dask worker running this task, so a build can say where each stage ran."""
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        return "local"


def where_limits() -> str:
    """Where a build's tasks share download slots, rates and the breaker: on the Dask cluster
    when the build runs on its own temporary Prefect server (which nothing else shares; the
    cluster answers in a message where the server takes a database write), otherwise on the
    Prefect server, so that builds sharing the server share the limits."""
    runner = FlowRunContext.get().task_runner
    return "cluster" if on_temporary_server() and isinstance(runner, DaskTaskRunner) else "prefect"


def backend(limits_on: str, client: Client | None = None) -> limits.Backend:
    """The backend of ``limits_on``; the cluster through ``client`` (by default the worker's, in
    a task)."""
    return cluster_backend(client) if limits_on == "cluster" else PREFECT


def flow_limits() -> limits.Backend:
    """The build's backend in the flow's own process (a stage's finish, a step such as discover
    that runs as a task called in the flow): the cluster through the task runner's client."""
    limits_on = where_limits()
    return backend(limits_on, FlowRunContext.get().task_runner.client if limits_on == "cluster" else None)


def prepare_download_limit(cfg: Config) -> None:
    """Create or resize the global concurrency limit downloads take slots of to the config's
    ``download.concurrency``; builds sharing a limit name should agree on its size."""
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(cfg.download.concurrency_limit, cfg.download.concurrency)


class StageTotals:
    """One stage's reports over partitions: counts per part, workers, task seconds."""

    def __init__(self) -> None:
        self.parts: dict[str, StageReport] = {}
        self.workers: set[str] = set()
        self.seconds = 0.0
        self.partitions = 0
        self.released = 0
        self.span: tuple[float, float] | None = None  # first task's start, last task's end

    def add(self, result: dict[str, Any]) -> None:
        for name, report in result["parts"].items():
            self.parts.setdefault(name, StageReport(name)).merge(StageReport(**report))
        self.workers.add(result["worker"])
        self.seconds += result["seconds"]
        self.partitions += 1
        self.released += result["released"]
        began, ended = result["began"], result["began"] + result["seconds"]
        self.span = (min(began, self.span[0]), max(ended, self.span[1])) if self.span else (began, ended)

    def add_idle(self, counts: dict[str, Counts]) -> None:
        """A partition without a task: its counts, from its summary, as a plan would find them."""
        for name, c in counts.items():
            self.parts.setdefault(name, StageReport(name)).merge(
                StageReport(name, total=c.upstream, skipped_done=c.done, skipped_failed=c.final))

    def as_dicts(self) -> dict[str, dict[str, Any]]:
        # Wall time: from the stage's first task to its last, overlapping other stages when
        # pipelined; task seconds: summed over its tasks.
        wall = round(self.span[1] - self.span[0], 3) if self.span else 0.0
        return {name: {**asdict(report), "workers": sorted(self.workers), "task_seconds":
                       round(self.seconds, 3), "wall_seconds": wall, "partitions": self.partitions}
                for name, report in self.parts.items()}


def gpu_routed(cfg: Config) -> set[str]:
    """The stages whose tasks ask Dask for a GPU worker: those whose models run on a GPU, when
    the cluster has GPU workers (`dask worker --resources GPU=1`, the local cluster's one per
    GPU) or a pool of them that comes when GPU tasks wait (SLURM's), or when
    ``execution.gpu_resource`` says so (featurize then whatever its device)."""
    if cfg.execution.gpu_resource:
        return gpu_stages(cfg) | {"featurize"}
    found = clusters.current()
    if found is not None and found.gpu_pool:
        return gpu_stages(cfg)
    workers = clusters.scheduler_workers(FlowRunContext.get().task_runner.client).values()
    return gpu_stages(cfg) if any(w.get("resources", {}).get("GPU") for w in workers) else set()


def task_resources(gpu: bool) -> dict[str, Any]:
    """The Dask annotation of a task: the resource it asks for on the build's cluster."""
    found = clusters.current()
    wanted = found.resources(gpu) if found is not None else ({"GPU": 1} if gpu else {})
    return {"resources": wanted} if wanted else {}


def chain_tasks(stage_names: list[str], on_gpu: set[str]) -> list[list[str]]:
    """A partition's chain as its tasks: the stages in order, one task for each run of stages
    that go to the same kind of worker (a stage on a GPU worker is a task of its own beside
    the CPU stages around it; without GPU routing the whole chain is one task)."""
    tasks: list[list[str]] = []
    for stage in stage_names:
        if tasks and (stage in on_gpu) == (tasks[-1][0] in on_gpu):
            tasks[-1].append(stage)
        else:
            tasks.append([stage])
    return tasks


def _submit(stages: list[str], partition: str, corpus: Corpus, cfg: Config, retry_failed: bool,
            limits_on: str, after: PrefectFuture | None = None, last: bool = False,
            gpu: bool = False) -> PrefectFuture:
    name = stages[0] if len(stages) == 1 else f"{stages[0]}..{stages[-1]}"
    with dask.annotate(**task_resources(gpu)):
        return partition_task.with_options(task_run_name=f"{name} p{partition}").submit(
            stages, partition, corpus.url, cfg, retry_failed, limits_on, last,
            wait_for=[after] if after is not None else None)


# Seconds between two looks at the cluster while the flow waits on its tasks.
WATCH_S = 2.0


def watch_cluster() -> None:
    """The cluster's jobs on the progress line ("SLURM: 2 GPU jobs pending"), and the build
    stopped, in the cluster's words, when it cannot go on (a job that cannot start)."""
    found = clusters.current()
    if found is None:
        return
    why = found.failure()
    if why is not None:
        raise SetupError(why)
    show_cluster(found.status())


class Finished:
    """The flow's futures as they finish, the cluster watched while none does."""

    def __init__(self) -> None:
        self._done: queue.SimpleQueue[PrefectFuture] = queue.SimpleQueue()
        self._arrived: set[PrefectFuture] = set()
        self._taken: set[PrefectFuture] = set()  # returned before their callback came

    def add(self, future: PrefectFuture) -> PrefectFuture:
        future.add_done_callback(self._done.put)
        return future

    def next(self, among: dict[PrefectFuture, Any] | set[PrefectFuture]) -> PrefectFuture:
        """Of the futures of ``among`` that have finished, the first in ``among``'s order (a
        partition's stages report in chain order even when they end together); waits for one."""
        while True:
            while not self._done.empty():
                self._arrive(self._done.get())
            ready = next((f for f in among if f in self._arrived or f.wrapped_future.done()), None)
            if ready is not None:
                if ready in self._arrived:
                    self._arrived.remove(ready)
                else:
                    self._taken.add(ready)
                return ready
            try:
                self._arrive(self._done.get(timeout=WATCH_S))
            except queue.Empty:
                watch_cluster()

    def _arrive(self, future: PrefectFuture) -> None:
        if future in self._taken:
            self._taken.remove(future)
        else:
            self._arrived.add(future)


def result_of(future: PrefectFuture) -> Any:
    """A future's result, the cluster watched while it runs."""
    arrivals = Finished()
    arrivals.next({arrivals.add(future)})
    return future.result()


def run_partitions(stage_names: list[str], corpus: Corpus, cfg: Config, retry_failed: bool,
                   pipelined: bool) -> dict[str, dict[str, Any]]:
    """The partition stages over every partition with work: as one chain of tasks per partition
    with at most ``execution.max_inflight_partitions`` chains at once, or one stage over all
    partitions before the next. A partition whose summary says it has nothing to do costs no
    task (its counts join the totals). Returns each part's totals (and the shard listings)."""
    logger = get_run_logger()
    started = time.time()
    stage_names = [name for name in stage_names if parts(name, cfg)]  # featurize may have none
    totals = {name: StageTotals() for name in stage_names}
    idle = idle_partitions(corpus, cfg, [p.name for n in stage_names for p in parts(n, cfg)], retry_failed)
    labels = [label for label in corpus.labels() if label not in idle]
    if idle:
        logger.info("%d partitions have nothing to do (from their summaries): no tasks for them", len(idle))
        for name in stage_names:
            for counts in idle.values():
                totals[name].add_idle({p.name: counts[p.name] for p in parts(name, cfg)})
    results: list[dict[str, Any]] = []
    limits_on = where_limits()
    on_gpu = gpu_routed(cfg)
    if "download" in stage_names and limits_on == "prefect":
        prepare_download_limit(cfg)
    progress = BuildProgress(stage_names, len(labels))
    failure: BaseException | None = None
    said: set[str] = set()  # the parts whose stop this pass has said

    def collect(future: PrefectFuture) -> None:
        nonlocal failure
        try:
            done = future.result()
        except Exception as exc:  # noqa: BLE001 - raised once the tasks in flight are done
            # A task that failed past its retries (a setup problem, a full disk): start no new
            # partition, let the others finish their batches, then fail the build. The tasks
            # after it in its chain do not run and end here too.
            failure = failure or exc
            return
        for result in done:
            results.append(result)
            progress.finished(result)
            for name, part in result["parts"].items():
                # Once a build, as soon as a task reports it: an outage or a block stops every
                # partition in flight, each on its worker, for the same reason.
                if part["stopped"] and name not in said:
                    said.add(name)
                    logger.warning("%s: %s", name, part["stopped"])

    try:
        if pipelined:
            limit = cfg.execution.max_inflight_partitions
            chain = chain_tasks(stage_names, on_gpu)
            logger.info("%d partitions, %d at a time: %s (%d task%s a partition)", len(labels), limit,
                        " -> ".join(stage_names), len(chain), "" if len(chain) == 1 else "s")
            waiting: dict[PrefectFuture, str] = {}
            left: dict[str, int] = {}  # partition in flight -> its tasks not finished
            pending = list(labels)
            arrivals = Finished()
            while pending or waiting:
                while pending and len(left) < limit and failure is None:
                    partition = pending.pop(0)
                    previous = None
                    for stages in chain:
                        previous = arrivals.add(_submit(stages, partition, corpus, cfg, retry_failed, limits_on,
                                                         previous, last=stages is chain[-1], gpu=stages[0] in on_gpu))
                        waiting[previous] = partition
                    left[partition] = len(chain)
                if not waiting:
                    break
                finished = arrivals.next(waiting)
                partition = waiting.pop(finished)
                count = len(results)
                collect(finished)
                if _stopped(results[count:]):
                    pending.clear()  # a stage stopped (downloads blocked): no new partitions
                left[partition] -= 1
                if not left[partition]:
                    del left[partition]
        else:
            for stage in stage_names:
                last = stage == stage_names[-1]
                arrivals = Finished()
                futures = {arrivals.add(_submit([stage], p, corpus, cfg, retry_failed, limits_on, last=last,
                                                 gpu=stage in on_gpu)) for p in labels}
                while futures:
                    future = arrivals.next(futures)
                    futures.discard(future)
                    collect(future)
                if failure is not None:
                    break
                logger.info("%s: %d partitions done", stage, len(labels))
    finally:
        progress.close()
    if failure is not None:
        raise failure
    for result in results:
        totals[result["stage"]].add(result)
    ctx = context(corpus, cfg)
    for name in stage_names:
        for part in parts(name, cfg):
            report = totals[name].parts.get(part.name)
            if report is None:
                continue
            if part.finish is not None:
                with limits.using(flow_limits()):
                    report.figures = part.finish(ctx, report, started)
    out: dict[str, dict[str, Any]] = {}
    for total in totals.values():
        out.update(total.as_dicts())
    if "shard" in stage_names:
        shard = totals["shard"]
        written = shard.parts["shard"].ok if "shard" in shard.parts else 0
        out["shard"] = {**out.get("shard", {}), **listing_task(corpus.url, cfg, written),
                        "media_released": shard.released}
    return out


def _stopped(results: list[dict[str, Any]]) -> bool:
    return any(p.get("stopped") for r in results for p in r["parts"].values())
