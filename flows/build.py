"""``build_corpus``: every built stage in order, each stage's batches as Prefect tasks on Dask.

The flow only composes pipeline/: it plans each stage with the runner, submits one task per
batch, and waits for the stage before starting the next. Tasks return small reports; the
tables are the results, so nothing large is held in Prefect.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import dask
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings
from prefect_dask import DaskTaskRunner

from pipeline.config import Config, config_hash, dump_config, load_config
from pipeline.runner import BatchReport, Item, plan, run_batch
from pipeline.stages import BUILT, Step, context, parts, stages_until
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


def _part(name: str, cfg: Config) -> Any:
    return next(p for p in parts(name.split(":", 1)[0], cfg) if p.name == name)


def resolve_config(config: str | Path | Config | dict) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return Config.model_validate(config)
    return load_config(config)


@flow(name="build_corpus", persist_result=False)
def build_corpus(
    config: str | Config,
    root: str | None = None,
    until: str | None = None,
    retry_failed: bool = False,
) -> dict[str, Any]:
    """Run the built stages up to ``until`` on the flow's task runner; returns the summary."""
    logger = get_run_logger()
    cfg = resolve_config(config)
    corpus = Corpus(_root(cfg, root))
    corpus.write_text("config.yaml", f"# config hash {config_hash(cfg)}\n{dump_config(cfg)}")
    reports: dict[str, dict[str, Any]] = {}
    for name in stages_until(until):
        if name not in BUILT:
            logger.info("stage %s is not built yet; skipped", name)
            continue
        for stage in parts(name, cfg):
            if isinstance(stage, Step):
                reports[stage.name] = run_step_task.submit(stage.name, corpus.url, cfg).result()
                continue
            ctx = context(corpus, cfg)
            size = stage.batch_size or cfg.execution.batch_size
            batches, report = plan(stage, ctx, size, retry_failed)
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
            reports[stage.name] = {**asdict(report), "workers": sorted(workers)}
    summary = summarize(corpus)
    summary["stages"] = reports
    return summary


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
) -> dict[str, Any]:
    """Entry point for the CLI and tests: ``build_corpus`` on the chosen Dask task runner."""
    cfg = resolve_config(config)
    chosen = _root(cfg, root)
    flow_fn = build_corpus.with_options(task_runner=task_runner(cfg, chosen, dask_address))
    with prefect_api():
        return flow_fn(cfg, root=chosen, until=until, retry_failed=retry_failed)


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
