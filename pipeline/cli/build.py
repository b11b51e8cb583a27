"""``vlcorpus build`` and ``vlcorpus demo``: the commands that run the pipeline."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import JsonLogs, Quiet, _emit, _error, _logging, app, console
from pipeline.cli.stopping import stops_on_signals
from pipeline.gc_pause import collector_paused
from pipeline.compose.checks import ChecksApart
from pipeline.config import ConfigError, load_config
from pipeline.errors import SetupError
from pipeline.graph import ORDER, check_name
from pipeline.progress import LogFormat, logs_to_file
from pipeline.corpus.storage import Corpus, LayoutError

Verbose = Annotated[bool, typer.Option("--verbose", "-v", help="Prefect's and Dask's logs on the "
                                       "console too (by default they go to a file under the root).")]


@contextlib.contextmanager
def _build_output(mode: LogFormat, verbose: bool, root: str) -> Iterator[None]:
    """By default a build shows its progress and summary; Prefect's, Dask's and ffmpeg's own
    output goes to a log file under the root (beside it for a remote root)."""
    if mode != "rich" or verbose:
        yield
        return
    corpus = Corpus(root)
    folder = Path(corpus.local_path("logs")) if corpus.is_local else Path("vlcorpus-logs")
    path = folder / f"build-{datetime.now(UTC):%Y%m%d-%H%M%S}.log"
    console.print(f"logs: {path}", highlight=False, markup=False)
    with logs_to_file(path):
        yield


@app.command()
def build(
    config: Annotated[Path, typer.Argument(help="YAML config file.", exists=True, dir_okay=False)],
    root: Annotated[str | None, typer.Option(help="Corpus root (path or fsspec URL).")] = None,
    until: Annotated[str | None, typer.Option(help=f"Last stage: {', '.join(ORDER)}.")] = None,
    dask_address: Annotated[str | None, typer.Option(help="Existing Dask scheduler.")] = None,
    retry_failed: Annotated[bool, typer.Option(help="Retry permanent failures too.")] = False,
    stage: Annotated[str | None, typer.Option(help="Run this stage's flow alone (its inputs "
                                                   "must be built).")] = None,
    quiet: Quiet = False,
    json_logs: JsonLogs = False,
    verbose: Verbose = False,
) -> None:
    """Run the pipeline for CONFIG, resuming whatever an earlier run left."""
    with stops_on_signals():
        _build(config, root, until, dask_address, retry_failed, stage, quiet, json_logs, verbose)


def _build(config: Path, root: str | None, until: str | None, dask_address: str | None, retry_failed: bool,
           stage: str | None, quiet: bool, json_logs: bool, verbose: bool) -> None:
    from flows import clusters
    from flows.clusters import fork_server
    from flows.temporary_server import server_unless_configured

    mode = _logging(quiet, json_logs)
    try:
        cfg = load_config(config)
        cfg.corpus_root(root)
        for name in (until, stage):
            if name is not None:
                check_name(name)
        if until is not None and stage is not None:
            raise ValueError("--until and --stage exclude each other")
    except (ConfigError, ValueError) as exc:
        _error(exc)
        raise typer.Exit(2) from None
    # A config that holds: whether the cluster takes the build's jobs (it answers at once);
    # then, together, the checks in a process of their own (the stages' libraries and the models
    # they load, torch, faster-whisper, stay out of this one), Prefect's server, the longest part
    # of a build's set-up (where the cluster's workers reach it), and a local cluster's fork
    # server, a fork of this process once it has imported the flows.
    checks = None
    server = None
    try:
        clusters.check(cfg, cfg.corpus_root(root), dask_address)
        checks = ChecksApart(cfg, until, stage)
        server = server_unless_configured(clusters.api_host(cfg, dask_address))
        if clusters.forks_here(cfg, dask_address):
            fork_server.start(from_here=True)
        checks.wait()
    except BaseException as exc:
        if checks is not None:
            checks.stop()
        if not isinstance(exc, SetupError):
            raise
        if server is not None:
            server.stop()
        fork_server.stop()
        _error(exc)
        raise typer.Exit(2) from None
    try:
        with _build_output(mode, verbose, cfg.corpus_root(root)), \
                clusters.forked_workers(cfg, cfg.corpus_root(root), dask_address):
            with collector_paused():
                from flows.services import prefect_server

            with prefect_server(server):
                with collector_paused():
                    from flows.build import run_build

                summary = run_build(cfg, root=root, until=until, dask_address=dask_address,
                                    retry_failed=retry_failed, stage=stage, checked=True)
    except (SetupError, LayoutError) as exc:
        _error(exc)
        raise typer.Exit(2) from None
    _time_setup(summary)
    _finish(summary, mode)


def _time_setup(summary: dict) -> None:
    """The command's seconds before the build's work began (imports, Prefect's server, the Dask
    cluster, the flow run) and of the work, beside the work's own start and end."""
    from pipeline.cli.started import process_started_at

    timing = summary.get("timing")
    if timing:
        # The demo's making of its videos is no cost of a build: it has a figure of its own.
        timing["setup_s"] = round(timing["work_started_at"] - process_started_at() - timing.get("site_s", 0), 2)
        timing["work_s"] = round(timing["work_ended_at"] - timing["work_started_at"], 2)


def _finish(summary: dict, mode: LogFormat) -> None:
    """The summary, then an unhealthy build's verdict on stderr and exit 1 (its work is
    committed; the config's health section says what a healthy build is)."""
    _emit(summary, mode)
    if not summary["health"]["healthy"]:
        _error(summary["health"]["message"])
        raise typer.Exit(1)


@app.command()
def demo(
    root: Annotated[Path, typer.Option(help="Where the demo site and corpus go.")] = Path(
        "demo-corpus"
    ),
    videos: Annotated[int, typer.Option(min=1, help="Narrated videos to generate.")] = 12,
    seed: Annotated[int, typer.Option(help="Seed of the generated videos.")] = 0,
    until: Annotated[str | None, typer.Option(help="Last stage.")] = None,
    port: Annotated[int, typer.Option(help="Port of the demo site on 127.0.0.1.")] = 8765,
    quiet: Quiet = False,
    json_logs: JsonLogs = False,
    verbose: Verbose = False,
) -> None:
    """Generate narrated demo videos, serve them on 127.0.0.1 and build a corpus from them."""
    mode = _logging(quiet, json_logs)
    if until is not None:
        check_name(until)
    from flows.clusters import fork_server
    from flows.demo import run_demo

    # Before the demo's site server thread and the build's checks (see _build).
    fork_server.start(from_here=True)
    with stops_on_signals(), _build_output(mode, verbose, str(root / "corpus")):
        summary = run_demo(root, n_videos=videos, seed=seed, until=until, port=port)
    _time_setup(summary)
    _finish(summary, mode)
