"""The stages of a build, in order, and which of them this version implements.

Most stages are runner stages (items in batches, see runner.py). Some run as one step over
the whole corpus: discover (its input is the config, and dedup spans all sources).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from pipeline import align, discover, download, featurize, report, shards, transcribe
from pipeline.config import Config
from pipeline.runner import RetryPolicy, Stage, StageContext
from pipeline.storage import Corpus

ORDER: tuple[str, ...] = (
    "discover", "download", "transcribe", "align", "featurize", "shard", "report", "train",
)


@dataclass(frozen=True)
class Step:
    """A stage that runs as one unit over the whole corpus; returns a JSON-able report."""

    name: str
    run: Callable[[StageContext], Any]

    def __call__(self, ctx: StageContext) -> dict[str, Any]:
        result = self.run(ctx)
        return asdict(result) if is_dataclass(result) else dict(result)


# Stage name -> factory of what it consists of (featurize: one runner stage per extractor).
BUILT: dict[str, Callable[[Config], list[Stage | Step]]] = {
    "discover": lambda cfg: [Step("discover", discover.discover)],
    "download": lambda cfg: [download.STAGE],
    "transcribe": lambda cfg: [transcribe.STAGE],
    "align": lambda cfg: [align.STAGE],
    "featurize": featurize.stages,
    "shard": lambda cfg: [Step("shard", shards.write_shards)],
    "report": lambda cfg: [Step("report", report.write_report)],
    "train": lambda cfg: [Step("train", _train_step)] if cfg.train is not None else [],
}


def _train_step(ctx: StageContext) -> dict[str, Any]:
    # Imported when training runs: torch and the trainer are not needed before.
    from pipeline.train.run import train_step

    return train_step(ctx)


class NotBuiltYet(RuntimeError):
    """A stage this version does not implement yet."""


def check_name(name: str) -> str:
    if name not in ORDER:
        raise ValueError(f"unknown stage {name!r}; stages: {', '.join(ORDER)}")
    return name


def stages_until(until: str | None) -> list[str]:
    """Stage names from the first up to and including ``until`` (all when None)."""
    if until is None:
        return list(ORDER)
    return list(ORDER[: ORDER.index(check_name(until)) + 1])


def parts(name: str, cfg: Config) -> list[Stage | Step]:
    try:
        factory = BUILT[check_name(name)]
    except KeyError:
        raise NotBuiltYet(f"stage {name!r} is not built yet in this version") from None
    return factory(cfg)


def context(corpus: Corpus, cfg: Config) -> StageContext:
    ex = cfg.execution
    retry = RetryPolicy(ex.retries + 1, ex.retry_backoff_s, ex.retry_backoff_max_s)
    return StageContext(corpus, cfg, retry)
