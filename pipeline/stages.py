"""The stages of a build, in order, and which of them this version implements."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.config import Config
from pipeline.runner import RetryPolicy, Stage, StageContext
from pipeline.storage import Corpus

ORDER: tuple[str, ...] = (
    "discover", "download", "transcribe", "align", "featurize", "shard", "report", "train",
)

# Stage name -> factory of the runner stages it consists of (featurize: one per extractor).
BUILT: dict[str, Callable[[Config], list[Stage]]] = {}


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


def runner_stages(name: str, cfg: Config) -> list[Stage]:
    try:
        factory = BUILT[check_name(name)]
    except KeyError:
        raise NotBuiltYet(f"stage {name!r} is not built yet in this version") from None
    return factory(cfg)


def context(corpus: Corpus, cfg: Config) -> StageContext:
    ex = cfg.execution
    retry = RetryPolicy(ex.retries + 1, ex.retry_backoff_s, ex.retry_backoff_max_s)
    return StageContext(corpus, cfg, retry)
