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

``stage.py`` defines stages and what they work with, ``plan.py`` finds what is left of one in a
partition, ``run.py`` runs it, ``watchdog.py`` tells a stalled batch from a slow one; this module
is the package's one import path for all three.
"""

from pipeline.runner.plan import FINAL_KINDS, KeySets, PartitionPlan, final_errors, key_sets, plan_partition
from pipeline.runner.run import error_row, run_batch, run_partition, run_stage, run_step
from pipeline.runner.stage import (
    BatchReport,
    Item,
    Outcome,
    RetryPolicy,
    Sink,
    Stage,
    StageContext,
    StageReport,
    Step,
    TableSink,
    attach,
    per_item,
    retrying,
    rows_of,
    table_inputs,
)
from pipeline.runner.watchdog import Stalled, stalled

__all__ = [
    "FINAL_KINDS", "BatchReport", "Item", "KeySets", "Outcome", "PartitionPlan", "RetryPolicy",
    "Sink", "Stage", "StageContext", "StageReport", "Step", "TableSink", "attach", "error_row",
    "final_errors", "key_sets", "per_item", "plan_partition", "retrying", "rows_of", "run_batch",
    "run_partition", "run_stage", "run_step", "Stalled", "stalled", "table_inputs",
]
