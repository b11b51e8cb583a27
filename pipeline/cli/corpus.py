"""Commands on a built corpus: ``status``, ``stats``, ``validate``, ``report``, ``migrate``."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

from pipeline.cli.common import JsonLogs, Root, _emit, _on_target, app, console, existing_corpus
from pipeline.corpus.summary import summarize


@app.command()
def status(
    target: Annotated[str, typer.Argument(metavar="ROOT", help="Corpus root (its config.yaml names "
                                                              "the extractors), or a config file.")],
    root: Root = None,
    by_partition: Annotated[bool, typer.Option("--partitions", help="Figures per partition too.")] = False,
    json_out: Annotated[bool, typer.Option("--json",
                                           help="One JSON object (shape: pipeline/compose/status.py).")] = False,
) -> None:
    """Per stage: items upstream, done, failed by kind, to do; read-only, safe during a build."""
    from pipeline.compose.status import corpus_status, print_status

    figures = _on_target(target, root, lambda corpus, cfg: corpus_status(corpus, cfg, by_partition))
    if json_out:
        print(json.dumps(figures))
    else:
        print_status(figures)


@app.command()
def stats(
    root: Annotated[str, typer.Argument(help="Corpus root.")],
    json_logs: JsonLogs = False,
) -> None:
    """Rows per table and errors by stage and kind."""
    _emit(summarize(existing_corpus(root)), "json" if json_logs else "rich")


@app.command()
def validate(
    root: Annotated[str, typer.Argument(help="Corpus root.")],
    quick: Annotated[bool, typer.Option("--quick", help="Check shards by size only, without "
                                                         "reading them for their sha256.")] = False,
    json_logs: JsonLogs = False,
) -> None:
    """Check every table against schemas/, that no key is lost between stages, and every shard
    against its index. Damaged shards are taken out of the index: the next build writes them
    again. The verdict goes to stdout; exit 1 on any violation."""
    from pipeline.corpus.validate import hand_back
    from pipeline.corpus.validate import validate as check

    corpus = existing_corpus(root)
    problems = check(corpus, hashes=not quick)
    handed = hand_back(corpus, problems)
    if json_logs:
        print(json.dumps({"root": root, "valid": not problems,
                          "violations": [str(p) for p in problems], "shards": handed}))
    else:
        out = Console(soft_wrap=True)
        for problem in problems:
            out.print(str(problem), style="red", markup=False, highlight=False)
        if handed:
            out.print(handed, markup=False, highlight=False)
        out.print(f"{len(problems)} violations in {root}" if problems else
                  f"{root}: valid ({', '.join(corpus.tables()) or 'no tables'})",
                  markup=False, highlight=False)
    if problems:
        raise typer.Exit(1)


@app.command()
def report(root: Annotated[str, typer.Argument(help="Corpus root.")]) -> None:
    """Write report/stats.json and report/report.html."""
    from pipeline.report import write_report
    from pipeline.runner import StageContext

    result = write_report(StageContext(existing_corpus(root), config=None))
    console.print(f"wrote {result['html']} and {result['stats']}")


@app.command()
def migrate(
    root: Annotated[str, typer.Argument(help="Corpus root of the flat layout (before partitions).")],
    partitions: Annotated[int | None, typer.Option(min=1, help="Partitions (default: as a first "
                                                               "build would choose).")] = None,
) -> None:
    """Move a corpus of the flat layout into partitions, in place."""
    from pipeline.corpus.migrate import migrate as move

    report = move(existing_corpus(root), partitions)
    moved = ", ".join(f"{t} {n}" for t, n in report.rows.items()) or "nothing"
    console.print(f"{root}: {report.partitions} partitions; rows moved: {moved}")
    if report.shards_moved_to:
        console.print(f"old shards kept in {report.shards_moved_to}; the next build writes new ones")
