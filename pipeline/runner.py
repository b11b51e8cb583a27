"""The stage runner of DESIGN.md: per partition, todo = input keys − done keys − final failures.

A stage says where its items are listed (the key column of its ``source`` table), which rows
the items to do give it (``inputs``: one item per distinct key), and how to turn a batch of
items into rows (``process``). Planning is Arrow set arithmetic over one
partition (its inputs, its output's done keys, its errors), so memory follows the partition,
not the corpus. The runner skips what earlier runs finished, works on the rest in batches,
retries transient failures with backoff, commits each batch atomically under a name derived
from its keys, and compacts the partition's small files at the end. Errors are committed
before the rows that mark a batch done, so a kill between the two loses nothing: the batch is
simply redone.

Corpus-wide steps (discover, train, report) are a separate kind, ``Step``: one unit over the
whole corpus, whose failure is an errors row in the ``corpus`` partition like any item's.
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline import partitions
from pipeline.errors import ErrorKind, SetupError, StageStopped, classify
from pipeline.ids import batch_name
from pipeline.progress import StepProgress, log
from pipeline.storage import Corpus

FINAL_KINDS = (ErrorKind.PERMANENT.value, ErrorKind.BAD_INPUT.value)


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
# (context, partition, keys to read) -> the rows of those keys
Inputs = Callable[[StageContext, str, pa.Array], pa.Table]
Keys = Callable[[StageContext, str], pa.Array]
# Called once after a run of the stage with its report and start time (time.time()); returns
# figures of the run that join the report.
Finish = Callable[[StageContext, "StageReport", float], dict[str, Any]]
# Checks what a stage needs before a build does any work (binaries, packages, models,
# credentials); raises SetupError with one line that says what to do.
Check = Callable[[Any], None]


class Sink(Protocol):
    """Where a stage's results go: a table by default; the shard stage writes shards."""

    def done_keys(self, corpus: Corpus, partition: str) -> pa.Array: ...

    def commit(self, corpus: Corpus, partition: str, name: str, rows: list[dict[str, Any]],
               done: list[str], stats: dict[str, dict[str, int]], replace: bool) -> None: ...

    def finish(self, corpus: Corpus, partition: str) -> None: ...


@dataclass(frozen=True)
class TableSink:
    table: str

    def done_keys(self, corpus: Corpus, partition: str) -> pa.Array:
        return corpus.done_keys(self.table, partition)

    def commit(self, corpus: Corpus, partition: str, name: str, rows: list[dict[str, Any]],
               done: list[str], stats: dict[str, dict[str, int]], replace: bool) -> None:
        if replace:
            corpus.replace_rows(self.table, partition, rows, done)
        else:
            corpus.write_batch(self.table, rows, name, partition, done=done, stats=stats)

    def finish(self, corpus: Corpus, partition: str) -> None:
        corpus.compact(self.table, partition)


@dataclass(frozen=True)
class Stage:
    """A per-partition stage. Its items are the distinct ``key`` values of its ``source``
    table's partition; ``inputs`` gives the rows of the items to do (``info`` columns go to
    ``Item.info`` from the item's first row); ``process`` handles a batch of items."""

    name: str
    output: str
    source: str
    inputs: Inputs
    process: Process
    key: str = "video_id"
    info: tuple[str, ...] = ()
    batch_size: int | None = None  # items per committed batch; None: execution.batch_size
    order: tuple[str, ...] = ()  # columns the work is ordered by before the key
    group: str | None = None  # no batch mixes two values of this column (shards: the split)
    # Keys done before that must be done again (a download whose media was dropped).
    redo: Keys | None = None
    sink: Sink | None = None  # None: the ``output`` table
    finish: Finish | None = None
    check: Check | None = None

    @property
    def target(self) -> Sink:
        return self.sink or TableSink(self.output)


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
    todo: int = 0
    figures: dict[str, Any] = field(default_factory=dict)  # from the stage's finish

    def plan_line(self, stage: str, partition: str) -> str:
        """What planning found, as the build logs it."""
        return (f"{stage} p{partition}: {self.total} items, {self.skipped_done} done before, "
                f"{self.skipped_failed} failed before, {self.todo} to do")

    def merge(self, other: StageReport) -> None:
        """Another partition's report of the same stage."""
        self.add(other)
        self.total += other.total
        self.skipped_done += other.skipped_done
        self.skipped_failed += other.skipped_failed
        self.todo += other.todo


def rows_of(ctx: StageContext, table: str, partition: str, key: str, keys: pa.Array,
            columns: list[str] | None = None) -> pa.Table:
    """The rows of ``keys`` in one partition of ``table``."""
    return ctx.corpus.read(table, columns=columns, filter=ds.field(key).isin(keys),
                           partition=partition)


def table_inputs(table: str, key: str = "video_id") -> Inputs:
    """Inputs that are one upstream table's rows."""
    return lambda ctx, partition, keys: rows_of(ctx, table, partition, key, keys)


def attach(rows: pa.Table, other: pa.Table, key: str) -> pa.Table:
    """``rows`` with the other columns of ``other`` (one row per ``key``) looked up by ``key``;
    null where ``other`` has none. (Arrow's hash join refuses list columns such as words.)"""
    where = pc.index_in(rows.column(key), value_set=other.column(key))
    for name in other.column_names:
        if name != key:
            rows = rows.append_column(pa.field(name, other.schema.field(name).type), other.column(name).take(where))
    return rows


def stage_errors(corpus: Corpus, stage: str, partition: str) -> pa.Table:
    """The errors rows of ``stage`` in one partition (item_id, kind, attempt), read column-only."""
    return corpus.read("errors", columns=["item_id", "kind", "attempt"],
                       filter=ds.field("stage") == stage, partition=partition)


def failures(corpus: Corpus, stage: str, partition: str,
             errors: pa.Table | None = None) -> tuple[pa.Array, dict[str, int]]:
    """Keys of one partition that failed for good in ``stage``, and the attempts of every key
    that failed at all (from ``errors``, the stage's errors rows, when given)."""
    errors = stage_errors(corpus, stage, partition) if errors is None else errors
    attempts = errors.group_by("item_id").aggregate([("attempt", "max")])
    return (final_keys(errors),
            dict(zip(attempts.column("item_id").to_pylist(), attempts.column("attempt_max").to_pylist())))


def final_keys(errors: pa.Table) -> pa.Array:
    """The keys of errors rows whose kind is final (permanent, bad_input): a run skips them."""
    final = errors.filter(pc.is_in(errors.column("kind"), pa.array(FINAL_KINDS)))
    return pc.unique(final.column("item_id")).cast(pa.string())


@dataclass(frozen=True)
class KeySets:
    """One partition of a stage as sets of keys: its input keys and, aligned with them, masks
    of those done, those failed for good, those done before that must be done again; every
    other key is to do. The one home of "what is left" for the runner and ``vlcorpus status``."""

    keys: pa.Array  # distinct input keys (strings)
    done: pa.Array  # bool: done, and not to be done again
    failed: pa.Array  # bool: not done, failed for good (skipped unless --retry-failed)
    redo: pa.Array  # bool: done before, to be done again
    errors: pa.Table  # the stage's errors rows in the partition (item_id, kind, attempt)

    @property
    def todo(self) -> pa.Array:
        return pc.filter(self.keys, pc.invert(pc.or_(self.done, self.failed)))


def key_sets(stage: Stage, ctx: StageContext, partition: str, retry_failed: bool = False) -> KeySets:
    """Input keys − done keys − final failures (+ keys to redo) of one partition, with Arrow,
    reading key columns only. It only reads committed files: safe while a build writes."""
    corpus = ctx.corpus
    listed = corpus.read(stage.source, columns=[stage.key], partition=partition)
    keys = pc.unique(listed.column(stage.key)).cast(pa.string())
    done = stage.target.done_keys(corpus, partition)
    errors = stage_errors(corpus, stage.name, partition)
    final = pa.array([], pa.string()) if retry_failed else final_keys(errors)
    redo = (pc.is_in(keys, stage.redo(ctx, partition)) if stage.redo
            else pa.array([False] * len(keys), pa.bool_()))
    is_done = pc.and_(pc.is_in(keys, done), pc.invert(redo))
    is_failed = pc.and_(pc.invert(is_done), pc.is_in(keys, final))
    return KeySets(keys, is_done, is_failed, redo, errors)


@dataclass
class PartitionPlan:
    """What is left of a stage in one partition: its todo rows in work order."""

    stage: Stage
    partition: str
    rows: pa.Table  # input rows of the todo keys, sorted by (group, order, key)
    keys: list[str]  # todo keys in that order
    attempts: dict[str, int]
    redo: set[str]
    report: StageReport

    def batches(self, size: int) -> Iterator[list[Item]]:
        """Items in batches of ``size`` keys; a batch never mixes two values of ``group``."""
        keys = self.rows.column(self.stage.key).to_pylist()
        groups = (self.rows.column(self.stage.group).to_pylist() if self.stage.group
                  else [None] * len(keys))
        # Row index where each key's rows start (rows are sorted, so a key's rows are adjacent).
        starts = [i for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1]] + [len(keys)]
        first = 0
        while first < len(starts) - 1:
            last = first + 1
            while (last < len(starts) - 1 and last - first < size
                   and groups[starts[last]] == groups[starts[first]]):
                last += 1
            yield self._items(self.rows.slice(starts[first], starts[last] - starts[first]))
            first = last

    def _items(self, rows: pa.Table) -> list[Item]:
        grouped: dict[str, list[dict[str, Any]]] = {}
        for row in rows.to_pylist():
            grouped.setdefault(row[self.stage.key], []).append(row)
        items = []
        for key, group in grouped.items():
            info = {name: group[0].pop(name) for name in self.stage.info}
            for row in group[1:]:
                for name in self.stage.info:
                    row.pop(name)
            items.append(Item(key, tuple(group), self.attempts.get(key, 0), info))
        return items


def plan_partition(stage: Stage, ctx: StageContext, partition: str,
                   retry_failed: bool = False) -> PartitionPlan:
    """The partition's todo: input keys − done − final failures (+ keys to redo), sorted."""
    corpus = ctx.corpus
    if stage.sink is None:
        corpus.sweep(stage.output, partition)
    corpus.sweep("errors", partition)
    sets = key_sets(stage, ctx, partition, retry_failed)
    _, attempts = failures(corpus, stage.name, partition, sets.errors)
    todo = sets.todo
    report = StageReport(stage.name, total=len(sets.keys), skipped_done=pc.sum(sets.done).as_py() or 0,
                         skipped_failed=pc.sum(sets.failed).as_py() or 0, todo=len(todo))
    rows = stage.inputs(ctx, partition, todo) if len(todo) else _empty_inputs(stage, ctx, partition)
    order = ([stage.group] if stage.group else []) + list(stage.order) + [stage.key]
    rows = rows.sort_by([(c, "ascending") for c in order])
    redo_keys = set(pc.filter(sets.keys, sets.redo).to_pylist())
    todo_keys = pc.unique(rows.column(stage.key)).to_pylist()
    return PartitionPlan(stage, partition, rows, todo_keys,
                         {k: attempts[k] for k in todo_keys if k in attempts}, redo_keys, report)


def _empty_inputs(stage: Stage, ctx: StageContext, partition: str) -> pa.Table:
    return stage.inputs(ctx, partition, pa.array([], pa.string()))


def run_batch(stage: Stage, items: Sequence[Item], ctx: StageContext, partition: str,
              redo: set[str] | None = None) -> BatchReport:
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


def error_row(stage: str, item: str, kind: ErrorKind | str, message: str, attempt: int,
              now: datetime | None = None) -> dict[str, Any]:
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
        log.warning("%s p%s: %s", stage.name, partition, report.stopped)
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
    if stage.finish is not None:
        total.figures = stage.finish(ctx, total, started)
    return total


@dataclass(frozen=True)
class Step:
    """A stage that runs as one unit over the whole corpus; returns a JSON-able report."""

    name: str
    run: Callable[[StageContext], Any]
    check: Check | None = None


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
