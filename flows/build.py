"""The pipeline as Prefect flows: ``build_corpus``, and one flow per stage.

``build_corpus`` discovers, then moves the corpus partition by partition: each partition's
download → transcribe → align → featurize → shard is a chain on the Dask cluster (one task, or
one for each run of stages that go to the same kind of worker),
with at most ``execution.max_inflight_partitions`` chains at once, so one partition is
featurized while the next downloads, and (with ``storage.keep_media: false``) only that many
partitions hold media. Then the shard listings, training and the report; with a score section,
training, then a second partition pass (score, and shard for the clips that waited for their
scores), then the report. With ``execution.pipelined: false`` it runs each stage's flow over
the whole corpus in turn instead; a stage flow alone is ``vlcorpus build --stage NAME`` or a
deployment entrypoint. The partition passes themselves are flows/partition_passes.py.

The flows only compose pipeline/. Tasks plan their own partition and return small reports;
the tables are the results, so nothing large is held in Prefect. Task runs grow with the
partitions that have work, not with items. Downloads take slots of a global concurrency limit that
holds across workers: Prefect's, shared by the builds on a Prefect server, or the Dask
cluster's for a build on its own temporary server (flows/partition_passes.py, ``where_limits``).
"""

# No ``from __future__ import annotations``: a served deployment (``rebuild_corpus.serve()``)
# sends the flow to its run's process by value, with only the globals its body reads, and
# Prefect validates the parameters from their annotations there (``rerun_of``'s UUID).

import json
import time
from pathlib import Path
from typing import Any
from uuid import UUID

# Prefect imports these at a process's first flow call: imported with the flows, they load
# while the temporary server starts, not after it is up (0.1 s).
import fastapi.encoders  # noqa: F401
import prefect.utilities.visualization  # noqa: F401
from prefect import Flow, flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.context import FlowRunContext
from prefect.states import Cancelled, Failed
import dask
from prefect.task_runners import TaskRunner
from prefect_dask import DaskTaskRunner

from flows import clusters
from flows.partition_passes import backend, flow_limits, result_of, run_partitions, task_resources, where_limits
from flows.build_progress import publish_summary
from flows.services import build_services
from flows.rerun import name_rerun
from flows.revive import revived
from flows.siblings import mark_crashed, repeated, superseded

from pipeline.config import Config, config_hash, dump_config, load_config
from pipeline.download import limits
from pipeline.errors import SetupError
from pipeline.compose.health import assess
from pipeline.graph import AFTER_TRAIN, ORDER, SPECS, check_name, stages_until
from pipeline.corpus.rootlock import Holder, root_lock
from pipeline.runner import run_step
from pipeline.score.stage import unavailable as score_unavailable
from pipeline.compose.stages import check_build, context, parts
from pipeline.corpus.storage import Corpus
from pipeline.corpus.summary import summarize


@task(name="step", task_run_name="{step_name}", retries=2, retry_delay_seconds=[2, 10],
      cache_policy=NO_CACHE, persist_result=False)
def step_task(step_name: str, root: str, cfg: Config, limits_on: str | None = None) -> dict[str, Any]:
    """A corpus-wide step with the build's shared limits (discover's searches go through the
    downloads' network watch): called in the flow's process (``limits_on`` None), or submitted
    to a worker with where the limits are (see ``run_step_task``)."""
    started = time.monotonic()
    step = next(p for p in parts(step_name, cfg))
    with limits.using(backend(limits_on) if limits_on else flow_limits()):
        report = run_step(step, context(Corpus(root), cfg))
    return {**report, "seconds": time.monotonic() - started}


def run_step_task(step_name: str, corpus: Corpus, cfg: Config) -> dict[str, Any]:
    """A corpus-wide step: in the flow's process on a local cluster, on a worker elsewhere (a
    SLURM login node or a Prefect worker's pod runs no stage); training on a GPU worker where
    the cluster has a GPU pool."""
    found = clusters.current()
    if found is None or found.local:
        return step_task(step_name, corpus.url, cfg)
    with dask.annotate(**task_resources(gpu=step_name == "train" and found.gpu_pool)):
        future = step_task.submit(step_name, corpus.url, cfg, where_limits())
    return result_of(future)


# A flow's config parameter: a YAML path, a Config or its dict. Typed loosely on purpose: a
# parameter typed as Config makes Prefect build the whole config's JSON schema for each flow
# at import (about 80 ms a flow, most of a second for the stage flows).
ConfigArg = Any


def resolve_config(config: str | Path | Config | dict) -> Config:
    if isinstance(config, Config):
        return config
    if isinstance(config, dict):
        return Config.model_validate(config)
    return load_config(config)


def _start(cfg: Config, root: str) -> Corpus:
    corpus = Corpus(root)
    corpus.write_text("config.yaml", f"# config hash {config_hash(cfg)}\n{dump_config(cfg)}")
    return corpus


def _stage_flow(name: str) -> Flow:
    def run(config: ConfigArg, root: str | None = None, retry_failed: bool = False) -> dict[str, Any]:
        cfg = resolve_config(config)
        corpus = _start(cfg, cfg.corpus_root(root))
        if SPECS[name].scope == "corpus":
            return {p.name: run_step_task(p.name, corpus, cfg) for p in parts(name, cfg)}
        if name == "score" and parts(name, cfg) and (why := score_unavailable(corpus, cfg)):
            raise SetupError(why)
        return run_partitions([name], corpus, cfg, retry_failed, pipelined=False)

    run.__doc__ = (f"The {name} stage of a corpus build over the whole corpus: one task per "
                   f"partition (or one step) on the flow's task runner. Returns its report.")
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
score_flow = STAGE_FLOWS["score"]


@flow(name="build_corpus", persist_result=False)
def build_corpus(
    config: ConfigArg,
    root: str | None = None,
    until: str | None = None,
    retry_failed: bool = False,
) -> dict[str, Any]:
    """Discover, the partition stages (pipelined, or a stage at a time), training and the
    report, up to ``until``; returns the summary with each stage's report. With a score
    section: after training, a second partition pass scores every clip (and shards the clips
    that waited for their score), and the report comes last."""
    started = time.time()
    cfg = resolve_config(config)
    corpus = _start(cfg, cfg.corpus_root(root))
    names = stages_until(until)
    reports: dict[str, Any] = {}

    def steps(name: str) -> None:
        # Corpus-wide steps run as tasks of this flow (a subflow each would cost a flow run
        # and a cluster connection for a step of seconds).
        for part in parts(name, cfg):
            reports[part.name] = run_step_task(part.name, corpus, cfg)

    partition_stages = [n for n in names if SPECS[n].scope == "partition" and n not in AFTER_TRAIN]
    after_train = [n for n in names if n in AFTER_TRAIN and parts(n, cfg)]
    if "discover" in names:
        steps("discover")
    if cfg.execution.pipelined and partition_stages:
        reports.update(run_partitions(partition_stages, corpus, cfg, retry_failed, pipelined=True))
    else:
        for name in partition_stages:
            stage_flow = STAGE_FLOWS[name].with_options(task_runner=_same_cluster())
            reports.update(stage_flow(cfg, root=corpus.url, retry_failed=retry_failed))
    record = record_run(corpus, reports) if partition_stages else None
    for name in (n for n in names if n not in ("discover", *partition_stages)):
        if name not in AFTER_TRAIN:
            steps(name)
        elif after_train:  # score comes after train in the stage order, so the report follows it
            reports.update(_after_train(corpus, cfg, "shard" in names, retry_failed, reports.get("shard")))
            record_run(corpus, reports, record)
    summary = summarize(corpus, write=True)
    summary["stages"] = reports
    publish_summary(summary, _report_url(corpus))
    # When the build's own work began and ended (epoch seconds): the rest of a command's time
    # is its set-up and teardown, the fixed cost of a build.
    summary["timing"] = {"work_started_at": round(started, 3), "work_ended_at": round(time.time(), 3)}
    return summary


def record_run(corpus: Corpus, reports: dict[str, Any], path: str | None = None) -> str:
    """The partition passes' reports of this build (counts, wall and task seconds, figures) in
    ``runs/build/``, for the report's timing section; returns the record's path. The score
    pass after train adds its reports to the same record (``path``), written first without
    them so that a build whose training fails still leaves its timing."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = path or f"runs/build/{stamp}.json"
    corpus.write_text(path, json.dumps({"finished": stamp, "stages": reports}, sort_keys=True, default=str) + "\n")
    return path


def _report_url(corpus: Corpus) -> str | None:
    path = corpus.path("report", "report.html")
    if not corpus.fs.exists(path):
        return None
    return Path(path).resolve().as_uri() if corpus.is_local else corpus.fs.unstrip_protocol(path)


def _after_train(corpus: Corpus, cfg: Config, shard: bool, retry_failed: bool,
                 first_shard: dict[str, Any] | None) -> dict[str, Any]:
    """The score stage over every partition once train is done, then (when the build shards)
    the shard stage again: the shards carry the scores, so clips wait for theirs. Without the
    score model (training skipped or failed) the pass is skipped and says why."""
    why = score_unavailable(corpus, cfg)
    if why is not None:
        get_run_logger().warning("score skipped: %s", why)
        return {"score": {"skipped": why}}
    reports = run_partitions(["score", "shard"] if shard else ["score"], corpus, cfg, retry_failed,
                             pipelined=cfg.execution.pipelined)
    if shard and first_shard is not None:  # the listing is the total; keep what the first pass did
        reports["shard"] = {**reports.get("shard", {}), "first_pass": first_shard}
    return reports


def _same_cluster() -> TaskRunner:
    """A task runner for a subflow on the current flow's cluster (a subflow would otherwise
    start a runner, and with it a local cluster, of its own)."""
    runner = FlowRunContext.get().task_runner
    if isinstance(runner, DaskTaskRunner):
        return DaskTaskRunner(address=runner.client.scheduler.address)
    return runner.duplicate()


def run_build(
    config: str | Path | Config,
    root: str | None = None,
    until: str | None = None,
    dask_address: str | None = None,
    retry_failed: bool = False,
    stage: str | None = None,
    checked: bool = False,
) -> dict[str, Any]:
    """Entry point for the CLI and tests: ``build_corpus``, or the flow of one ``stage`` alone,
    on the chosen Dask task runner; returns the corpus summary with the stages' reports and
    the build's health (the config's health section). ``checked``: the caller ran
    ``check_build`` for these arguments already (the command line does)."""
    cfg = resolve_config(config)
    chosen = cfg.corpus_root(root)
    # Before the cluster or any download: what the stages need is there, and the cluster would
    # take the build's jobs.
    if not checked:
        clusters.check(cfg, chosen, dask_address)
        check_build(cfg, until, stage)
    with root_lock(chosen, **_lock_owner()), build_services(cfg, chosen, dask_address) as address:
        runner = DaskTaskRunner(address=address)
        if stage is None:
            summary = build_corpus.with_options(task_runner=runner)(cfg, root=chosen, until=until,
                                                                    retry_failed=retry_failed)
        else:
            stage_flow = STAGE_FLOWS[check_name(stage)].with_options(task_runner=runner)
            reports = stage_flow(cfg, root=chosen, retry_failed=retry_failed)
            summary = {**summarize(Corpus(chosen), write=True), "stages": reports}
    summary["health"] = assess(cfg.health, summary).as_dict()
    return summary


def _lock_owner() -> dict[str, Any]:
    """Who takes the root lock and where its messages go: the deployment's flow run (whose log
    the server keeps; a run that died holding the root is marked Crashed when this one takes
    it over) or the command line."""
    run = FlowRunContext.get()
    if run is None:
        return {"label": "vlcorpus build"}
    label, logger = f"flow run {run.flow_run.name!r}", get_run_logger()

    def crashed(holder: Holder, reason: str) -> None:
        try:
            marked = mark_crashed(holder, reason, label)
        except Exception as exc:  # noqa: BLE001 - another server's run, or the server is busy
            logger.warning("could not mark the run of %s Crashed: %s", holder.describe(), exc)
            return
        if marked:
            logger.warning("marked %d run(s) of %s Crashed: %s", len(marked), holder.describe(), reason)

    return {"label": label, "logger": logger, "run": str(run.flow_run.id), "on_takeover": crashed}


@flow(name="rebuild_corpus", persist_result=False)
def rebuild_corpus(
    config: str,
    root: str | None = None,
    until: str | None = None,
    dask_address: str | None = None,
    retry_failed: bool = False,
    rerun_of: UUID | None = None,
) -> dict[str, Any]:
    """The deployments' entry point (scheduled and ad hoc): ``build_corpus`` as a subflow on
    the Dask cluster of ``dask_address`` (or of the config, or a local one). An unhealthy
    build (the config's health section) ends Failed once everything it did is committed. A
    scheduled run with a newer one of its deployment also due (missed while no worker was up)
    ends Cancelled without building: the newest builds. ``rerun_of``: the id of the Crashed
    run that this one runs again (set by a deployment's rerun, flows/rerun.py); a second rerun
    of the same run ends Cancelled too."""
    run = FlowRunContext.get().flow_run
    if rerun_of is not None:
        crashed = name_rerun(run, rerun_of)  # first: the run's logs carry its new name
        get_run_logger().warning("this run is %r run again, which ended Crashed; it resumes that build's "
                                 "committed batches", crashed.name)
    why = superseded(run) if rerun_of is None else repeated(run, crashed)
    if why is not None:
        get_run_logger().warning(why)
        return Cancelled(message=why)
    with revived(run.id, get_run_logger()):
        summary = run_build(config, root=root, until=until, dask_address=dask_address,
                            retry_failed=retry_failed)
    if not summary["health"]["healthy"]:
        get_run_logger().error(summary["health"]["message"])
        # The message alone: Prefect raises a failed state's data as the run's exception, which
        # a summary is not (a TypeError in the worker's flow process).
        return Failed(message=summary["health"]["message"])
    return summary
