"""What a stage is: the items it works on and their outcomes, what it may use
(``StageContext``), its definition (``Stage`` per partition, ``Step`` over the whole corpus),
what a run of it reports, and the helpers stage functions are written with (``per_item``,
``retrying``, ``rows_of``, ``table_inputs``, ``attach``)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.errors import ErrorKind, SetupError, StageStopped, classify
from pipeline.progress import beat, log
from pipeline.corpus.storage import Corpus


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
    Returns (result, last exception, tries). A stop (StageStopped) is no failure of the call:
    it is raised to the caller."""
    attempt = 1
    while True:
        try:
            return fn(), None, attempt
        except StageStopped:
            raise
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


@dataclass(frozen=True)
class Step:
    """A stage that runs as one unit over the whole corpus; returns a JSON-able report."""

    name: str
    run: Callable[[StageContext], Any]
    check: Check | None = None


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
                outcomes.append(Outcome(item.key, kind=kind, message=message))
            beat()
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
