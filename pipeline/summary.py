"""Counts per table and errors by kind: what `vlcorpus stats` and the end of a build print."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.progress import stdout_console
from pipeline.storage import Corpus


def summarize(corpus: Corpus) -> dict[str, Any]:
    """``{"tables": {name: rows}, "errors": {stage: {kind: n}}}``, read without loading data."""
    tables = {name: corpus.dataset(name).count_rows() for name in corpus.tables()}
    errors: dict[str, dict[str, int]] = {}
    # Items, not rows: a transient failure retried over several runs is one item. An item's
    # errors are all in its partition, so per-partition counts add up.
    for partition in corpus.partitions_of("errors") if "errors" in tables else []:
        data = corpus.read("errors", columns=["stage", "kind", "item_id"], partition=partition)
        counts = data.group_by(["stage", "kind"]).aggregate([("item_id", "count_distinct")])
        for row in counts.to_pylist():
            kinds = errors.setdefault(row["stage"], {})
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + row["item_id_count_distinct"]
    errors = {stage: dict(sorted(kinds.items())) for stage, kinds in sorted(errors.items())}
    # Per-item counters kept with the batches, e.g. align's drop reasons.
    counters = {name: corpus.stats(name) for name in tables if name != "errors"}
    return {"root": corpus.url, "tables": tables, "errors": errors,
            "counters": {name: c for name, c in counters.items() if c}}


def print_summary(summary: dict[str, Any], console: Console | None = None) -> None:
    console = console or stdout_console()
    # The root on a line of its own: as a table title it would wrap at the table's width.
    console.print(f"corpus {summary['root']}", soft_wrap=True, highlight=False, markup=False)
    rows = Table(title="rows per table")
    rows.add_column("table")
    rows.add_column("rows", justify="right")
    for name, n in summary["tables"].items():
        rows.add_row(name, str(n))
    console.print(rows)
    for table, counts in summary.get("counters", {}).items():
        extra = Table(title=f"{table}: counters")
        extra.add_column("counter")
        extra.add_column("n", justify="right")
        for name, n in counts.items():
            extra.add_row(name, str(n))
        console.print(extra)
    if summary["errors"]:
        errs = Table(title="errors by stage and kind")
        errs.add_column("stage")
        errs.add_column("kind")
        errs.add_column("items", justify="right")
        for stage, kinds in summary["errors"].items():
            for kind, n in kinds.items():
                errs.add_row(stage, kind, str(n))
        console.print(errs)
    else:
        console.print("no errors")
