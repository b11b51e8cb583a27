"""The implementation of each stage of the graph (pipeline/graph.py), by name.

Per-partition stages are runner stages (featurize: one per extractor); corpus-wide ones are
steps. Modules with heavy imports (the report's plotting, the trainer's torch) are imported
when their step runs.
"""

from __future__ import annotations

from typing import Any

from pipeline import align, discover, download, featurize, transcribe
from pipeline.config import Config
from pipeline.graph import check_name
from pipeline.runner import RetryPolicy, Stage, StageContext, Step
from pipeline.shards.stage import make_stage as shard_stage
from pipeline.storage import Corpus


def _report(ctx: StageContext) -> dict[str, Any]:
    from pipeline.report import write_report

    return write_report(ctx)


def _train(ctx: StageContext) -> dict[str, Any]:
    from pipeline.train.run import train_step

    return train_step(ctx)


def parts(name: str, cfg: Config) -> list[Stage | Step]:
    """What stage ``name`` consists of for this config (no train step without a train section)."""
    match check_name(name):
        case "discover":
            return [Step("discover", discover.discover)]
        case "download":
            return [download.STAGE]
        case "transcribe":
            return [transcribe.STAGE]
        case "align":
            return [align.STAGE]
        case "featurize":
            return list(featurize.stages(cfg))
        case "shard":
            return [shard_stage(cfg)]
        case "report":
            return [Step("report", _report)]
        case "train":
            return [Step("train", _train)] if cfg.train is not None else []
    raise AssertionError(name)


def context(corpus: Corpus, cfg: Config) -> StageContext:
    ex = cfg.execution
    retry = RetryPolicy(ex.retries + 1, ex.retry_backoff_s, ex.retry_backoff_max_s)
    return StageContext(corpus, cfg, retry)
