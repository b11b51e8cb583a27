"""Planning: what is left of a stage in one partition, as Arrow set arithmetic over key columns
(input keys − done keys − final failures, + keys to redo), and that todo in work order, in
batches. A build plans with ``plan_partition``; ``vlcorpus status`` counts with ``key_sets``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from pipeline.errors import GONE_HOST_PREFIX, LEGACY_INTERNAL_PREFIX, NETWORK_FAILURE, ErrorKind
from pipeline.runner.stage import Item, Stage, StageContext, StageReport
from pipeline.corpus.storage import Corpus

# Failures no later run retries (unless --retry-failed): retrying cannot fix them.
FINAL_KINDS = (ErrorKind.PERMANENT.value, ErrorKind.BAD_INPUT.value)

# The kind an errors row counts as, read with it: its own, but internal for the rows that
# earlier versions wrote as permanent when our own code failed ("unexpected TypeError: ..."),
# and transient for those they wrote as permanent when the network failed (a name that did not
# resolve), so that the next run retries those items instead of skipping them for good.
_PERMANENT = ds.field("kind") == ErrorKind.PERMANENT.value
# A host judged gone across runs (GONE_HOST_PREFIX) stays permanent: that is a verdict.
_LEGACY_NETWORK = (_PERMANENT & ~pc.starts_with(ds.field("message"), GONE_HOST_PREFIX)
                   & pc.match_substring_regex(ds.field("message"), NETWORK_FAILURE, ignore_case=True))
KIND = pc.if_else(_PERMANENT & pc.starts_with(ds.field("message"), LEGACY_INTERNAL_PREFIX),
                  ErrorKind.INTERNAL.value,
                  pc.if_else(_LEGACY_NETWORK, ErrorKind.TRANSIENT.value, ds.field("kind")))


def stage_errors(corpus: Corpus, stage: str, partition: str) -> pa.Table:
    """The errors rows of ``stage`` in one partition (item_id, kind, attempt), read column-only."""
    return corpus.read("errors", columns={"item_id": ds.field("item_id"), "kind": KIND,
                                          "attempt": ds.field("attempt")},
                       filter=ds.field("stage") == stage, partition=partition)


def final_errors(corpus: Corpus, stage: str, partition: str) -> pa.Array:
    """The keys that failed for good in ``stage`` in one partition."""
    return final_keys(stage_errors(corpus, stage, partition))


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
