"""The pipeline as Prefect flows: one flow per stage, and ``build_corpus``, which runs them in
order as subflows on one Dask cluster.

The flows only compose pipeline/: a stage flow plans its stage with the runner, submits one
task per batch, and waits for them. Tasks return small reports; the tables are the results,
so nothing large is held in Prefect. Downloads take slots of a Prefect global concurrency
limit, so the limit holds across workers and across builds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dask
from prefect import Flow, flow, get_run_logger, task
from prefect.client.orchestration import get_client
from prefect.context import FlowRunContext
from prefect.cache_policies import NO_CACHE
from prefect.logging.handlers import APILogWorker
from prefect.task_runners import TaskRunner
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect_dask import DaskTaskRunner

from flows.shared import PREFECT
from pipeline.config import Config, config_hash, dump_config, load_config
from pipeline.runner import BatchReport, Item, plan, run_batch
from pipeline import limits
from pipeline.stages import ORDER, Step, check_name, context, parts, stages_until
from pipeline.storage import Corpus
from pipeline.summary import summarize


@task(
    name="run-batch",
    task_run_name="{stage_name} batch {index}/{total}",
    retries=2,
    retry_delay_seconds=[2, 10],
    cache_policy=NO_CACHE,
    persist_result=False,
)
def run_batch_task(
    stage_name: str, index: int, total: int, items: list[Item], root: str, cfg: Config
) -> dict[str, Any]:
    # Stages are rebuilt on the worker from their name: only data travels, never closures.
    stage = _part(stage_name, cfg)
    with limits.using(PREFECT):
        report = run_batch(stage, items, context(Corpus(root), cfg))
    return {**asdict(report), "worker": _worker_name()}


def _worker_name() -> str:
    """The Dask worker running this task, so a build can say where each stage ran."""
    try:
        from distributed import get_worker

        return str(get_worker().name)
    except (ImportError, ValueError):
        return "local"


@task(name="run-step", task_run_name="{step_name}", retries=2, retry_delay_seconds=[2, 10],
      cache_policy=NO_CACHE, persist_result=False)
def run_step_task(step_name: str, root: str, cfg: Config) -> dict[str, Any]:
    return _part(step_name, cfg)(context(Corpus(root), cfg))


def prepare_download_limit(cfg: Config) -> None:
    """Create or resize the global concurrency limit downloads take slots of to the config's
    ``download.concurrency``; builds sharing a limit name should agree on its size."""
    with get_client(sync_client=True) as client:
        client.upsert_global_concurrency_limit_by_name(cfg.download.concurrency_limit, cfg.download.concurrency)


def _part(name: str, cfg: Config) -> Any:
    return next(p for p in parts(name.split(":", 1)[0], cfg) if p.name == name)


def resolve_config(config: str | Path | Config | dict) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return Config.model_validate(config)
    return load_config(config)


def run_parts(name: str, cfg: Config, corpus: Corpus, retry_failed: bool = False) -> dict[str, dict[str, Any]]:
    """Every part of stage ``name`` on the current flow's task runner, one after the other;
    runner stages as one task per batch. Returns each part's report."""
    logger = get_run_logger()
    reports: dict[str, dict[str, Any]] = {}
    for stage in parts(name, cfg):
        if isinstance(stage, Step):
            reports[stage.name] = run_step_task.submit(stage.name, corpus.url, cfg).result()
            continue
        size = stage.batch_size or cfg.execution.batch_size
        started = time.time()
        batches, report = plan(stage, context(corpus, cfg), size, retry_failed)
        logger.info(
            "%s: %d items, %d done before, %d failed before, %d batches to run",
            stage.name, report.total, report.skipped_done, report.skipped_failed, len(batches),
        )
        # GPU workers (`dask worker --resources GPU=1`) take featurize tasks when asked.
        gpu = cfg.execution.gpu_resource and stage.name.startswith("featurize:")
        with dask.annotate(**({"resources": {"GPU": 1}} if gpu else {})):
            futures = [
                run_batch_task.submit(stage.name, i + 1, len(batches), batch, corpus.url, cfg)
                for i, batch in enumerate(batches)
            ]
        workers: set[str] = set()
        for future in futures:
            result = future.result()
            workers.add(result.pop("worker"))
            report.add(BatchReport(**result))
        if report.stopped:
            logger.warning("%s: %s", stage.name, report.stopped)
        if stage.finish is not None:
            with limits.using(PREFECT):
                report.figures = stage.finish(context(corpus, cfg), report, started)
        reports[stage.name] = {**asdict(report), "workers": sorted(workers)}
    return reports


def _stage_flow(name: str) -> Flow:
    def run(config: str | Config, root: str | None = None, retry_failed: bool = False) -> dict[str, Any]:
        cfg = resolve_config(config)
        corpus = Corpus(_root(cfg, root))
        corpus.write_text("config.yaml", f"# config hash {config_hash(cfg)}\n{dump_config(cfg)}")
        if name == "download":
            prepare_download_limit(cfg)
        return run_parts(name, cfg, corpus, retry_failed)

    run.__doc__ = (f"The {name} stage of a corpus build: its batches as tasks on the flow's task "
                   f"runner. Returns each part's report.")
    return flow(run, name=name, persist_result=False)


# One flow per stage, in build order. Each runs alone (`vlcorpus build --stage NAME`, or a
# deployment entrypoint such as flows/build.py:download_flow) or as a subflow of build_corpus.
STAGE_FLOWS: dict[str, Flow] = {name: _stage_flow(name) for name in ORDER}
discover_flow = STAGE_FLOWS["discover"]
download_flow = STAGE_FLOWS["download"]
transcribe_flow = STAGE_FLOWS["transcribe"]
align_flow = STAGE_FLOWS["align"]
featurize_flow = STAGE_FLOWS["featurize"]
shard_flow = STAGE_FLOWS["shard"]
report_flow = STAGE_FLOWS["report"]
train_flow = STAGE_FLOWS["train"]


@flow(name="build_corpus", persist_result=False)
def build_corpus(
    config: str | Config,
    root: str | None = None,
    until: str | None = None,
    retry_failed: bool = False,
) -> dict[str, Any]:
    """The stage flows up to ``until`` in order, each a subflow on this flow's Dask cluster;
    returns the summary."""
    cfg = resolve_config(config)
    corpus = Corpus(_root(cfg, root))
    reports: dict[str, dict[str, Any]] = {}
    for name in stages_until(until):
        stage_flow = STAGE_FLOWS[name].with_options(task_runner=_same_cluster())
        reports.update(stage_flow(cfg, root=corpus.url, retry_failed=retry_failed))
    summary = summarize(corpus)
    summary["stages"] = reports
    return summary


def _same_cluster() -> TaskRunner:
    """A task runner for a subflow on the current flow's cluster (a subflow would otherwise
    start a runner, and with it a local cluster, of its own)."""
    runner = FlowRunContext.get().task_runner
    if isinstance(runner, DaskTaskRunner):
        return DaskTaskRunner(address=runner.client.scheduler.address)
    return runner.duplicate()


def _root(cfg: Config, root: str | None) -> str:
    chosen = root or cfg.root
    if not chosen:
        raise ValueError("no corpus root: pass --root or set `root:` in the config")
    return chosen


def task_runner(cfg: Config, root: str, dask_address: str | None = None) -> DaskTaskRunner:
    """A runner on the given Dask cluster, else a local one sized by the config."""
    # The environment variable lets a deployment's workers point every build at their cluster.
    address = dask_address or cfg.execution.dask_address or os.environ.get("VLCORPUS_DASK_ADDRESS")
    if address:
        return DaskTaskRunner(address=address)
    # An in-memory root is only visible inside this process: use threads, not processes.
    in_memory = root.startswith("memory://")
    return DaskTaskRunner(
        cluster_kwargs={
            "n_workers": cfg.execution.n_workers or 2,
            "threads_per_worker": cfg.execution.threads_per_worker,
            "processes": not in_memory,
            "dashboard_address": None,
        }
    )


@contextmanager
def prefect_api() -> Iterator[None]:
    """Prefect's temporary local server when no API is configured, started once and shared
    with the Dask worker processes (which inherit the environment), so that each worker does
    not start a server of its own."""
    if PREFECT_API_URL.value():
        yield
        return
    from prefect.server.api.server import SubprocessASGIServer

    # The server would otherwise try to reach Prefect's telemetry endpoint on every start.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    server = SubprocessASGIServer()
    server.start()
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            yield
    finally:
        # Send the run's last logs while the server is still there to take them.
        APILogWorker.drain_all()
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def run_build(
    config: str | Path | Config,
    root: str | None = None,
    until: str | None = None,
    dask_address: str | None = None,
    retry_failed: bool = False,
    stage: str | None = None,
) -> dict[str, Any]:
    """Entry point for the CLI and tests: ``build_corpus``, or the flow of one ``stage`` alone,
    on the chosen Dask task runner; returns the corpus summary with the stages' reports."""
    cfg = resolve_config(config)
    chosen = _root(cfg, root)
    runner = task_runner(cfg, chosen, dask_address)
    with prefect_api():
        if stage is None:
            return build_corpus.with_options(task_runner=runner)(cfg, root=chosen, until=until,
                                                                 retry_failed=retry_failed)
        stage_flow = STAGE_FLOWS[check_name(stage)].with_options(task_runner=runner)
        reports = stage_flow(cfg, root=chosen, retry_failed=retry_failed)
    summary = summarize(Corpus(chosen))
    summary["stages"] = reports
    return summary


@flow(name="rebuild_corpus", persist_result=False)
def rebuild_corpus(
    config: str,
    root: str | None = None,
    until: str | None = None,
    dask_address: str | None = None,
    retry_failed: bool = False,
) -> dict[str, Any]:
    """The deployments' entry point (scheduled and ad hoc): ``build_corpus`` as a subflow on
    the Dask cluster of ``dask_address`` (or of the config, or a local one)."""
    return run_build(config, root=root, until=until, dask_address=dask_address,
                     retry_failed=retry_failed)
