"""The implementation of each stage of the graph (pipeline/graph.py), by name.

Per-partition stages are runner stages (featurize: one per extractor); corpus-wide ones are
steps. Modules with heavy imports (the report's plotting, the trainer's torch) are imported
when their step runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from pipeline import discover
from pipeline.align import stage as align
from pipeline.featurize import stage as featurize
from pipeline.score import stage as scoring
from pipeline.transcribe import stage as transcribe
from pipeline.download import stage as download
from pipeline.corpus import retention
from pipeline.config import Config
from pipeline.graph import check_name, stages_until
from pipeline.progress import log
from pipeline.runner import RetryPolicy, Stage, StageContext, Step, run_stage, run_step
from pipeline.setup import check_stages, require_package
from pipeline.shards.stage import make_stage as shard_stage
from pipeline.shards.stage import write_shards
from pipeline.corpus.storage import Corpus


def _report(ctx: StageContext) -> dict[str, Any]:
    from pipeline.report import write_report

    return write_report(ctx)


def _train(ctx: StageContext) -> dict[str, Any]:
    from pipeline.train.run import train_step

    return train_step(ctx)


# Stage name -> what it consists of for a config (featurize: one runner stage per extractor;
# train and score: nothing without their section).
BUILT: dict[str, Callable[[Config], list[Stage | Step]]] = {
    "discover": lambda cfg: [Step("discover", discover.discover)],
    "download": lambda cfg: [download.STAGE],
    "transcribe": lambda cfg: [transcribe.STAGE],
    "align": lambda cfg: [align.STAGE],
    "featurize": featurize.stages,
    "shard": lambda cfg: [shard_stage(cfg)],
    "report": lambda cfg: [Step("report", _report)],
    "train": lambda cfg: [Step("train", _train, check=_train_check)] if cfg.train is not None else [],
    "score": scoring.stages,
}


def _train_check(cfg: Config) -> None:
    require_package("torch", "training", extra="train")


def parts(name: str, cfg: Config) -> list[Stage | Step]:
    return BUILT[check_name(name)](cfg)


def gpu_stages(cfg: Config) -> set[str]:
    """The stages whose models run on a GPU where there is one: featurize with extractors on
    ``features.device`` auto or cuda, transcribe with faster-whisper ASR on
    ``transcribe.asr.device`` auto or cuda. Their tasks ask Dask for the resource GPU=1 on a
    cluster with GPU workers (the local cluster has one per GPU)."""
    on_gpu = {"auto", "cuda"}
    stages = set()
    if cfg.features.extractors and cfg.features.device.split(":")[0] in on_gpu:
        stages.add("featurize")
    asr = cfg.transcribe.asr
    if "asr" in cfg.transcribe.prefer and asr.backend == "faster-whisper" and asr.device.split(":")[0] in on_gpu:
        stages.add("transcribe")
    return stages


def check_build(cfg: Config, until: str | None = None, stage: str | None = None) -> None:
    """What the stages a build runs need (extras, models, weights, binaries), checked before
    any work: the first problem raises a SetupError that says what to do. Models the build
    will download on first use are logged, once per process (a test process builds many
    times)."""
    names = [stage] if stage else stages_until(until)
    for note in check_stages(cfg, [part for name in names for part in parts(name, cfg)]):
        if note not in _NOTED:
            _NOTED.add(note)
            log.info("%s", note)


_NOTED: set[str] = set()


def run_local(name: str, ctx: StageContext) -> dict[str, Any]:
    """Stage ``name`` over the whole corpus in this process, one partition after the other
    (the flows run the same on Dask): steps, runner stages, then what follows a stage (the
    shard listings, dropping media); returns each part's report."""
    cfg: Config = ctx.config
    reports: dict[str, Any] = {}
    for part in parts(name, cfg):
        if isinstance(part, Step):
            reports[part.name] = run_step(part, ctx)
        elif name == "shard":
            reports[part.name] = write_shards(ctx)
        else:
            reports[part.name] = asdict(run_stage(part, ctx, part.batch_size or cfg.execution.batch_size))
    if name == "shard" and not cfg.storage.keep_media:
        reports["media_released"] = sum(retention.release(ctx, p) for p in ctx.corpus.labels())
    return reports


def context(corpus: Corpus, cfg: Config) -> StageContext:
    ex = cfg.execution
    retry = RetryPolicy(ex.retries + 1, ex.retry_backoff_s, ex.retry_backoff_max_s)
    return StageContext(corpus, cfg, retry)
