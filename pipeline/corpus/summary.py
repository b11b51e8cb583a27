"""Counts per table and errors by kind: what `vlcorpus stats` and the end of a build print."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table

from pipeline.corpus import partsummary
from pipeline.progress import stdout_console
from pipeline.corpus.storage import Corpus

SECTION = "tables"


def partition_figures(corpus: Corpus, partition: str) -> dict[str, Any]:
    """One partition's rows and counters per table (read from footers) and its errors' items by
    stage and kind: the summary's section of the partition's summary."""
    found = {table: corpus.figures(table, partition) for table in corpus.tables()}
    tables = {table: figures for table, figures in found.items() if figures is not None}
    errors: dict[str, dict[str, int]] = {}
    if "errors" in tables:
        # Items, not rows: a transient failure retried over several runs is one item. An
        # item's errors are all in its partition, so per-partition counts add up.
        data = corpus.read("errors", columns=["stage", "kind", "item_id"], partition=partition)
        counts = data.group_by(["stage", "kind"]).aggregate([("item_id", "count_distinct")])
        for row in counts.to_pylist():
            errors.setdefault(row["stage"], {})[row["kind"]] = row["item_id_count_distinct"]
    return {"tables": tables, "errors": errors}


def summarize(corpus: Corpus, write: bool = False) -> dict[str, Any]:
    """``{"tables": {name: rows}, "errors": {stage: {kind: n}}, "counters": {table: {name: n}}}``
    from the partitions' summaries (rescanning those missing or stale; with ``write``, storing
    them), read without loading data."""
    found = partsummary.gather(corpus, {SECTION: partition_figures}, write=write)
    return added_up(corpus, (sections[SECTION] for sections in found.values()))


def added_up(corpus: Corpus, partitions: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """``summarize``'s figures from the partitions' sections (``partition_figures``), for a
    reader that gathers them with sections of its own (the report)."""
    present = corpus.tables()
    tables = dict.fromkeys(present, 0)
    errors: dict[str, dict[str, int]] = {}
    counters: dict[str, dict[str, int]] = {}
    for figures in partitions:
        for table, figure in figures["tables"].items():
            if table not in tables:  # written since the tables were listed: the next has it
                continue
            tables[table] += figure["rows"]
            if table != "errors":
                _add(counters.setdefault(table, {}), figure["stats"])
        for stage, kinds in figures["errors"].items():
            _add(errors.setdefault(stage, {}), kinds)
    errors = {stage: dict(sorted(kinds.items())) for stage, kinds in sorted(errors.items())}
    return {"root": corpus.url, "tables": tables, "errors": errors,
            "counters": {name: dict(sorted(c.items())) for name, c in counters.items() if c}}


def _add(totals: dict[str, int], more: dict[str, int]) -> None:
    for name, n in more.items():
        totals[name] = totals.get(name, 0) + n


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
