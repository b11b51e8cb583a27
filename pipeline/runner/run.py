"""Running: one batch with retries and its commit (errors first, then the rows that mark it
done), a partition's batches then compaction, a stage over every partition in this process,
and a corpus-wide step."""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from datetime import UTC, datetime
from typing import Any

from pipeline.corpus import partitions
from pipeline.errors import ErrorKind, SetupError, StageStopped, classify
from pipeline.ids import batch_name
from pipeline.progress import StepProgress, log
from pipeline.runner.plan import plan_partition
from pipeline.runner.stage import BatchReport, Item, Outcome, Stage, StageContext, StageReport, Step
from pipeline.corpus.storage import Corpus
from pipeline.runner.watchdog import Stalled, run_watched


def run_batch(stage: Stage, items: Sequence[Item], ctx: StageContext, partition: str,
              redo: set[str] | None = None) -> BatchReport:
    """Process one batch with retries for transient failures, then commit it. When the stage
    stops (StageStopped), what was settled is committed and the rest stays to do."""
    pending = list(items)
    settled: dict[str, Outcome] = {}
    tries: Tally = Tally()
    for attempt in range(1, ctx.retry.attempts + 1):
        try:
            outcomes = _process_guarded(stage, pending, ctx, partition)
        except Stalled as stall:
            # The stuck items fail as internal (never final: the next run tries them again);
            # the stage stops, as the thread that stalled may hold what the next batch needs.
            for item in pending:
                tries[item.key] = attempt
                settled[item.key] = Outcome(item.key, kind=ErrorKind.INTERNAL, message=str(stall))
            report = commit(stage, items, settled, tries, ctx.corpus, partition, redo or set())
            report.stopped = str(stall)
            return report
        except StageStopped as stop:
            # The items this attempt retried keep only what the stop settled: an earlier
            # transient failure of theirs is no outcome (the stop's cause, a network down, may
            # be its cause too), so they stay to do with no errors row.
            for item in pending:
                settled.pop(item.key, None)
            for outcome in stop.finished:
                tries[outcome.key] = attempt
                settled[outcome.key] = outcome
            report = commit(stage, [i for i in items if i.key in settled], settled, tries,
                            ctx.corpus, partition, redo or set())
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
    return commit(stage, items, settled, tries, ctx.corpus, partition, redo or set())


def _process_guarded(stage: Stage, items: Sequence[Item], ctx: StageContext, partition: str) -> list[Outcome]:
    """A batch function that raises fails every item of the batch, not the run; one that stalls
    raises Stalled."""
    execution = getattr(ctx.config, "execution", None)
    try:
        outcomes = run_watched(lambda: stage.process(items, ctx), getattr(execution, "stall_s", None),
                               f"{stage.name} p{partition}")
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


def error_row(stage: str, item: str, kind: ErrorKind | str, message: str, attempt: int,
              now: datetime | None = None) -> dict[str, Any]:
    """One row of the ``errors`` table."""
    return {"stage": stage, "item_id": item, "kind": str(kind), "message": message,
            "attempt": attempt, "time": now or datetime.now(UTC)}


def commit(stage: Stage, items: Sequence[Item], outcomes: dict[str, Outcome], tries: Tally,
           corpus: Corpus, partition: str, redo: set[str]) -> BatchReport:
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
        # Logged here, not where it failed: a stage may judge a failure again once its batch
        # is over (download's HTTP 403s), and a transient one may succeed on a retry.
        log.warning("%s failed (%s): %s", item.key, outcome.kind, outcome.message)
        report.errors[outcome.kind.value] = report.errors.get(outcome.kind.value, 0) + 1
        error_rows.append(error_row(stage.name, item.key, outcome.kind, outcome.message,
                                    item.attempts_before + tries[item.key], now))
    if error_rows:
        corpus.write_batch("errors", error_rows, name, partition)
    rows: list[dict[str, Any]] = []
    done: list[str] = []
    stats: dict[str, dict[str, int]] = {}
    for item in items:
        outcome = outcomes[item.key]
        if outcome.ok:
            rows.extend(outcome.rows)
            done.append(item.key)
            if outcome.stats:
                stats[item.key] = outcome.stats
    if done:
        stage.target.commit(corpus, partition, name, rows, done, stats,
                            replace=bool(redo & set(done)))
    report.ok = len(done)
    report.rows = len(rows)
    return report


def run_partition(stage: Stage, ctx: StageContext, partition: str, batch_size: int,
                  retry_failed: bool = False) -> StageReport:
    """Every batch left of ``stage`` in one partition, then compaction of what it wrote."""
    plan = plan_partition(stage, ctx, partition, retry_failed)
    report = plan.report
    if plan.keys:
        log.info(report.plan_line(stage.name, partition))
    with StepProgress(f"{stage.name} p{partition}", report.todo) as bar:
        for batch in plan.batches(batch_size):
            if report.stopped:
                report.left += len(batch)  # the stage stopped: the rest stays to do
                continue
            report.add(run_batch(stage, batch, ctx, partition, plan.redo))
            bar.advance(len(batch))
    if report.stopped:
        # Its reason is said once for the stage by the caller (run_stage, or the flow over the
        # partitions in flight): an outage or a block stops every one of them.
        log.info("%s p%s: stopped with %d left to do", stage.name, partition, report.left)
    stage.target.finish(ctx.corpus, partition)
    ctx.corpus.compact("errors", partition)
    return report


def run_stage(stage: Stage, ctx: StageContext, batch_size: int, retry_failed: bool = False) -> StageReport:
    """A stage over every partition, one after the other, in this process (flows run the
    partitions as tasks on Dask instead)."""
    started = time.time()
    total = StageReport(stage.name)
    for partition in ctx.corpus.labels():
        if total.stopped:  # count what the stop leaves to do in the partitions not started
            total.left += plan_partition(stage, ctx, partition, retry_failed).report.todo
            continue
        total.merge(run_partition(stage, ctx, partition, batch_size, retry_failed))
        if total.stopped:
            log.warning("%s: %s", stage.name, total.stopped)
    if stage.finish is not None:
        total.figures = stage.finish(ctx, total, started)
    return total


def run_step(step: Step, ctx: StageContext) -> dict[str, Any]:
    """Run a corpus-wide step; a failure (not of setup) is an errors row of the ``corpus``
    partition and the report says so, as for any item."""
    try:
        result = step.run(ctx)
    except SetupError:
        raise
    except Exception as exc:  # noqa: BLE001 - recorded, the build goes on
        kind, message = classify(exc)
        log.error("%s failed (%s): %s", step.name, kind, message)
        ctx.corpus.write_batch("errors", [error_row(step.name, step.name, kind, message, 1)],
                               f"{step.name}-{batch_name([message])}", partitions.CORPUS)
        return {"failed": message}
    return asdict(result) if is_dataclass(result) else dict(result)
