"""The one ``vlcorpus`` app and what its commands share: messages, logging, printing a build's
summary, and finding the corpus and config a command is pointed at.

Commands import what they use inside their bodies (Prefect, torch, the stages), so that
``vlcorpus --help`` stays fast.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.config import Config, ConfigError, config_from_yaml, load_config
from pipeline.errors import SetupError
from pipeline.progress import LogFormat, setup_logging, stdout_console
from pipeline.corpus.storage import Corpus
from pipeline.corpus.summary import print_summary

app = typer.Typer(
    help="Build video-text corpora: discover, download, transcribe, align, featurize, shard.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# Soft wrap: paths and commands in messages stay whole on one line, to copy or grep.
console = Console(stderr=True, soft_wrap=True)

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")]
JsonLogs = Annotated[bool, typer.Option("--json", help="Logs and results as JSON lines.")]
Root = Annotated[str | None, typer.Option(help="Corpus root (default: the config's).")]


def _error(message: object) -> None:
    """A message in red, printed as it is (no rich markup: it may hold brackets)."""
    console.print(str(message), style="red", markup=False, highlight=False)


def _logging(quiet: bool, json_logs: bool) -> LogFormat:
    mode: LogFormat = "json" if json_logs else "quiet" if quiet else "rich"
    setup_logging(mode)
    # Dask's cluster chatter is noise to a user; workers read this when they start.
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
    if mode != "rich":
        # Prefect's own run logs follow the same choice.
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    return mode


def _emit(summary: dict, mode: LogFormat) -> None:
    if mode == "json":
        print(json.dumps(summary, default=str))
        return
    out = stdout_console()
    print_summary(summary, out)
    stages = summary.get("stages", {})
    for name, report in stages.items():
        if isinstance(report, dict) and report.get("stopped"):
            out.print(f"{name}: {report['stopped']}", style="red", markup=False, highlight=False)
    if "report" in stages:
        out.print(f"report: {stages['report']['html']}", highlight=False)
    formats = {kind: info for kind, info in stages.get("shard", {}).items()
               if kind in ("webdataset", "parquet") and info}
    for kind, info in formats.items():
        if info["shards"]:
            out.print(f"{kind} shards: {info['samples']} samples in {info['shards']} shards in "
                      f"{summary['root'].rstrip('/')}/shards/{kind}", highlight=False)
    if formats and not any(info["shards"] for info in formats.values()):
        # No folder to point at: nothing was written, and a reader would find nothing there.
        out.print("shards: none, no clip to shard yet", highlight=False)
    trained = stages.get("train", {})
    if trained.get("t2v"):
        n, t2v = trained["n_test"], trained["t2v"]
        out.print(f"train: text-to-video R@1 {t2v['R@1']:.1f}, R@5 {t2v['R@5']:.1f}, median rank "
                  f"{t2v['medR']:g} on {n} {trained['split']} clips (chance: R@1 {100 / n:.1f}, "
                  f"R@5 {min(500 / n, 100):.1f}); metrics and curve in {trained['out']}", highlight=False)
    elif "skipped" in trained:
        out.print(f"train skipped: {trained['skipped']}", highlight=False)
    for name, report in stages.items():
        if name.startswith("score:") and isinstance(report, dict) and "ok" in report:
            out.print(f"{name}: {report['ok']} clips scored, {report['skipped_done']} scored before, "
                      f"{sum(report['errors'].values())} failed; scores/{name.split(':', 1)[1]}", highlight=False)
    if "skipped" in stages.get("score", {}):
        out.print(f"score skipped: {stages['score']['skipped']}", highlight=False)
    timing = summary.get("timing", {})
    if "setup_s" in timing:
        site = f"{timing['site_s']:.1f} s making the demo site, " if "site_s" in timing else ""
        out.print(f"time: {site}{timing['setup_s']:.1f} s to start (Prefect server, Dask cluster), "
                  f"{timing['work_s']:.1f} s of work", highlight=False)


def existing_corpus(root: str) -> Corpus:
    """The corpus at ``root``, which must exist: a mistyped path would otherwise read as an
    empty corpus (validate: "valid"). Exits 2 with one line saying so."""
    corpus = Corpus(root)
    if not corpus.fs.exists(corpus.root):
        _error(f"{root} does not exist: no corpus there (check the path)")
        raise typer.Exit(2)
    return corpus


def _target(target: str, root: str | None) -> tuple[Corpus, Config]:
    """A config file (its root, or --root), or a corpus root (its resolved config.yaml)."""
    path = Path(target)
    if path.is_file():
        cfg = load_config(path)
        return Corpus(cfg.corpus_root(root)), cfg
    corpus = existing_corpus(root or target)
    # Through the root's filesystem: the root may be on an object store.
    text = corpus.fs.cat_file(corpus.path("config.yaml")).decode("utf-8")
    return corpus, config_from_yaml(text, f"{corpus.url.rstrip('/')}/config.yaml")


def _on_target(target: str, root: str | None, run: Callable[[Corpus, Config], dict]) -> dict:
    """``run`` on the corpus and config of TARGET; unusable input exits 2 with its message."""
    setup_logging("rich")
    try:
        return run(*_target(target, root))
    except (ConfigError, ValueError, FileNotFoundError, SetupError) as exc:
        _error(exc)
        raise typer.Exit(2) from None
