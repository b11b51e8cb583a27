"""The stage runner of DESIGN.md: todo = input keys − done keys − permanent failures.

A stage says which items exist (``items``) and how to turn a batch of them into rows
(``process``). The runner skips what earlier runs finished, works on the rest in batches,
retries transient failures with backoff, and commits each batch atomically under a name
derived from its keys. Errors are committed before the rows that mark a batch done, so a
kill between the two loses nothing: the batch is simply redone.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

import pyarrow.dataset as ds

from pipeline.errors import ErrorKind, SetupError, StageStopped, classify
from pipeline.ids import batch_name
from pipeline.progress import Counter, log
from pipeline.storage import Corpus


@dataclass(frozen=True)
class Item:
    """One unit of work: its key, its input rows, and context from other tables."""

    key: str
    rows: tuple[dict[str, Any], ...] = ()
    attempts_before: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class Outcome:
    """What happened to one item: output rows, or a failure with its kind."""

    key: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    kind: ErrorKind | None = None
    message: str = ""
    stats: dict[str, int] = field(default_factory=dict)  # e.g. drop reasons, kept with the batch

    @property
    def ok(self) -> bool:
        return self.kind is None


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 3
    backoff_s: float = 1.0
    backoff_max_s: float = 60.0

    def delay(self, attempt: int) -> float:
        """Exponential backoff before retry number ``attempt`` (1-based)."""
        return min(self.backoff_max_s, self.backoff_s * 2 ** (attempt - 1))


@dataclass(frozen=True)
class StageContext:
    """What a stage function may use: the corpus, the config, the retry policy."""

    corpus: Corpus
    config: Any
    retry: RetryPolicy = RetryPolicy()


T = TypeVar("T")


def retrying(fn: Callable[[], T], policy: RetryPolicy) -> tuple[T | None, Exception | None, int]:
    """Call ``fn`` until it succeeds or fails for a non-transient reason or runs out of tries.
    Returns (result, last exception, tries)."""
    attempt = 1
    while True:
        try:
            return fn(), None, attempt
        except Exception as exc:  # noqa: BLE001 - the caller records it
            kind, message = classify(exc)
            if kind != ErrorKind.TRANSIENT or attempt >= policy.attempts:
                return None, exc, attempt
            log.info("retrying in %.1fs after: %s", policy.delay(attempt), message)
            time.sleep(policy.delay(attempt))
            attempt += 1


Process = Callable[[Sequence[Item], StageContext], list[Outcome]]
# Called once after a run of the stage with its report and start time (time.time()); returns
# figures of the run that join the report.
Finish = Callable[[StageContext, "StageReport", float], dict[str, Any]]


@dataclass(frozen=True)
class Stage:
    """A stage: ``items`` lists every item it should cover, ``process`` handles a batch."""

    name: str
    output: str
    items: Callable[[StageContext], Iterable[Item]]
    process: Process
    batch_size: int | None = None  # items per committed batch; None: execution.batch_size
    finish: Finish | None = None


ItemFn = Callable[[Item, StageContext], "list[dict[str, Any]] | Outcome"]


def per_item(fn: ItemFn) -> Process:
    """Lift a one-item function (returning rows, or an Outcome with stats) to a batch
    function; its exceptions become failed outcomes."""

    def process(items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
        outcomes = []
        for item in items:
            try:
                result = fn(item, ctx)
                outcomes.append(result if isinstance(result, Outcome)
                                else Outcome(item.key, rows=result))
            except (SetupError, StageStopped):
                raise
            except Exception as exc:  # noqa: BLE001 - every failure becomes an errors row
                kind, message = classify(exc)
                log.warning("%s failed (%s): %s", item.key, kind, message)
                outcomes.append(Outcome(item.key, kind=kind, message=message))
        return outcomes

    return process


@dataclass
class BatchReport:
    stage: str
    items: int = 0
    ok: int = 0
    rows: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # kind -> items
    counters: dict[str, int] = field(default_factory=dict)  # the outcomes' stats, summed
    stopped: str | None = None  # why the stage stopped early (StageStopped)
    left: int = 0  # items the stop left to do

    def add(self, other: BatchReport) -> None:
        self.items += other.items
        self.ok += other.ok
        self.rows += other.rows
        self.left += other.left
        self.stopped = self.stopped or other.stopped
        for mine, theirs in ((self.errors, other.errors), (self.counters, other.counters)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n


@dataclass
class StageReport(BatchReport):
    total: int = 0
    skipped_done: int = 0
    skipped_failed: int = 0
    figures: dict[str, Any] = field(default_factory=dict)  # from the stage's finish


def input_items(corpus: Corpus, table: str, key: str) -> list[Item]:
    """Items grouped by ``key`` from an upstream table, each with all of its rows."""
    data = corpus.read(table).sort_by([(key, "ascending")])
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in data.to_pylist():
        groups.setdefault(row[key], []).append(row)
    return [Item(k, tuple(rows)) for k, rows in groups.items()]


def failures(corpus: Corpus, stage: str) -> tuple[set[str], Tally]:
    """Keys that failed for good in ``stage``, and how many attempts each key has had."""
    errors = corpus.read(
        "errors", columns=["item_id", "kind", "attempt"], filter=ds.field("stage") == stage
    )
    final = {ErrorKind.PERMANENT.value, ErrorKind.BAD_INPUT.value}
    failed: set[str] = set()
    attempts: Tally = Tally()
    for row in errors.to_pylist():
        attempts[row["item_id"]] = max(attempts[row["item_id"]], row["attempt"])
        if row["kind"] in final:
            failed.add(row["item_id"])
    return failed, attempts


def plan(
    stage: Stage, ctx: StageContext, batch_size: int, retry_failed: bool = False
) -> tuple[list[list[Item]], StageReport]:
    """Batches of what is left to do, in key order so that reruns batch alike."""
    corpus = ctx.corpus
    corpus.sweep_temporary(stage.output)
    corpus.sweep_temporary("errors")
    done = corpus.done(stage.output)
    failed, attempts = failures(corpus, stage.name)
    if retry_failed:
        failed = set()
    report = StageReport(stage.name)
    todo: dict[str, Item] = {}
    for item in stage.items(ctx):
        report.total += 1
        if item.key in done:
            report.skipped_done += 1
        elif item.key in failed:
            report.skipped_failed += 1
        elif item.key not in todo:
            todo[item.key] = replace(item, attempts_before=attempts[item.key])
    ordered = [todo[k] for k in sorted(todo)]
    batches = [ordered[i : i + batch_size] for i in range(0, len(ordered), batch_size)]
    return batches, report


def run_batch(stage: Stage, items: Sequence[Item], ctx: StageContext) -> BatchReport:
    """Process one batch with retries for transient failures, then commit it. When the stage
    stops (StageStopped), what was settled is committed and the rest stays to do."""
    pending = list(items)
    settled: dict[str, Outcome] = {}
    tries: Tally = Tally()
    for attempt in range(1, ctx.retry.attempts + 1):
        try:
            outcomes = _process_guarded(stage, pending, ctx)
        except StageStopped as stop:
            for outcome in stop.finished:
                tries[outcome.key] = attempt
                settled[outcome.key] = outcome
            report = commit(stage, [i for i in items if i.key in settled], settled, tries,
                            ctx.corpus)
            report.items, report.left, report.stopped = len(items), len(items) - report.items, str(stop)
            return report
        for outcome in outcomes:
            tries[outcome.key] = attempt
            settled[outcome.key] = outcome
        pending = [i for i in pending if settled[i.key].kind == ErrorKind.TRANSIENT]
        if not pending or attempt == ctx.retry.attempts:
            break
        delay = ctx.retry.delay(attempt)
        log.info("%s: retrying %d transient failures in %.1fs", stage.name, len(pending), delay)
        time.sleep(delay)
    return commit(stage, items, settled, tries, ctx.corpus)


def _process_guarded(stage: Stage, items: Sequence[Item], ctx: StageContext) -> list[Outcome]:
    """A batch function that raises fails every item of the batch, not the run."""
    try:
        outcomes = stage.process(items, ctx)
    except (SetupError, StageStopped):
        raise
    except Exception as exc:  # noqa: BLE001 - recorded per item below
        kind, message = classify(exc)
        log.warning("%s: batch failed (%s): %s", stage.name, kind, message)
        return [Outcome(i.key, kind=kind, message=message) for i in items]
    missing = {i.key for i in items} - {o.key for o in outcomes}
    if missing:
        raise RuntimeError(f"{stage.name}: process returned no outcome for {sorted(missing)}")
    return outcomes


def commit(
    stage: Stage,
    items: Sequence[Item],
    outcomes: dict[str, Outcome],
    tries: Tally,
    corpus: Corpus,
) -> BatchReport:
    name = f"{stage.name.replace(':', '_')}-{batch_name([i.key for i in items])}"
    now = datetime.now(UTC)
    report = BatchReport(stage.name, items=len(items))
    error_rows = []
    for item in items:
        outcome = outcomes[item.key]
        for key, n in outcome.stats.items():
            report.counters[key] = report.counters.get(key, 0) + n
        if outcome.ok:
            continue
        report.errors[outcome.kind.value] = report.errors.get(outcome.kind.value, 0) + 1
        error_rows.append(
            {
                "stage": stage.name,
                "item_id": item.key,
                "kind": outcome.kind.value,
                "message": outcome.message,
                "attempt": item.attempts_before + tries[item.key],
                "time": now,
            }
        )
    if error_rows:
        corpus.write_batch("errors", error_rows, name)
    rows: list[dict[str, Any]] = []
    done: dict[str, int] = {}
    stats: dict[str, dict[str, int]] = {}
    for item in items:
        outcome = outcomes[item.key]
        if outcome.ok:
            rows.extend(outcome.rows)
            done[item.key] = len(outcome.rows)
            if outcome.stats:
                stats[item.key] = outcome.stats
    if done:
        corpus.write_batch(stage.output, rows, name, done=done, stats=stats)
    report.ok = len(done)
    report.rows = len(rows)
    return report


def run_stage(
    stage: Stage, ctx: StageContext, batch_size: int, retry_failed: bool = False
) -> StageReport:
    """Run a stage to completion in this process (flows run the batches on Dask instead)."""
    started = time.time()
    batches, report = plan(stage, ctx, batch_size, retry_failed)
    todo = sum(len(b) for b in batches)
    log.info(
        "%s: %d items, %d done before, %d failed before, %d to do",
        stage.name, report.total, report.skipped_done, report.skipped_failed, todo,
    )
    with Counter(stage.name, todo) as bar:
        for batch in batches:
            report.add(run_batch(stage, batch, ctx))
            bar.advance(len(batch))
    if report.stopped:
        log.warning("%s: %s", stage.name, report.stopped)
    if stage.finish is not None:
        report.figures = stage.finish(ctx, report, started)
    return report

