"""The ``vlcorpus`` command line (DESIGN.md: interfaces that stay stable)."""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from pipeline.config import Config, ConfigError, load_config
from pipeline.errors import SetupError
from pipeline.progress import LogFormat, setup_logging
from pipeline.graph import ORDER, check_name
from pipeline.storage import Corpus, LayoutError
from pipeline.summary import print_summary, summarize

app = typer.Typer(
    help="Build video-text corpora: discover, download, transcribe, align, featurize, shard.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
# Soft wrap: paths and commands in messages stay whole on one line, to copy or grep.
console = Console(stderr=True, soft_wrap=True)


def _error(message: object) -> None:
    """A message in red, printed as it is (no rich markup: it may hold brackets)."""
    console.print(str(message), style="red", markup=False, highlight=False)

Quiet = Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")]
JsonLogs = Annotated[bool, typer.Option("--json", help="Logs and results as JSON lines.")]


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
    out = Console()
    print_summary(summary, out)
    stages = summary.get("stages", {})
    for name, report in stages.items():
        if isinstance(report, dict) and report.get("stopped"):
            out.print(f"{name}: {report['stopped']}", style="red", markup=False, highlight=False)
    if "report" in stages:
        out.print(f"report: {stages['report']['html']}", highlight=False)
    for kind in ("webdataset", "parquet"):
        info = stages.get("shard", {}).get(kind)
        if info:
            out.print(f"{kind} shards: {info['samples']} samples in {info['shards']} shards in "
                      f"{summary['root'].rstrip('/')}/shards/{kind}", highlight=False)
    for name, report in stages.items():
        if name.startswith("score:") and isinstance(report, dict) and "ok" in report:
            out.print(f"{name}: {report['ok']} clips scored, {report['skipped_done']} scored before, "
                      f"{sum(report['errors'].values())} failed; scores/{name.split(':', 1)[1]}", highlight=False)
    if "skipped" in stages.get("score", {}):
        out.print(f"score skipped: {stages['score']['skipped']}", highlight=False)
    trained = stages.get("train", {})
    if trained.get("t2v"):
        n, t2v = trained["n_test"], trained["t2v"]
        out.print(f"train: text-to-video R@1 {t2v['R@1']:.1f}, R@5 {t2v['R@5']:.1f}, median rank "
                  f"{t2v['medR']:g} on {n} {trained['split']} clips (chance: R@1 {100 / n:.1f}, "
                  f"R@5 {min(500 / n, 100):.1f}); metrics and curve in {trained['out']}", highlight=False)
    elif "skipped" in trained:
        out.print(f"train skipped: {trained['skipped']}", highlight=False)


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
) -> None:
    """Run the pipeline for CONFIG, resuming whatever an earlier run left."""
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
    # Prefect is imported only when a build runs; its temporary server starts while the flows
    # are imported.
    from flows.services import prefect_server

    try:
        with prefect_server():
            from flows.build import run_build

            summary = run_build(cfg, root=root, until=until, dask_address=dask_address,
                                retry_failed=retry_failed, stage=stage)
    except (SetupError, LayoutError) as exc:
        _error(exc)
        raise typer.Exit(2) from None
    _emit(summary, mode)


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
) -> None:
    """Generate narrated demo videos, serve them on 127.0.0.1 and build a corpus from them."""
    mode = _logging(quiet, json_logs)
    if until is not None:
        check_name(until)
    from flows.demo import run_demo

    summary = run_demo(root, n_videos=videos, seed=seed, until=until, port=port)
    _emit(summary, mode)


demo_site = typer.Typer(help="The demo site alone: make narrated videos with captions, serve them.",
                        no_args_is_help=True)
app.add_typer(demo_site, name="demo-site")
SiteDir = Annotated[Path, typer.Argument(metavar="DIR", help="The site's folder.")]


@demo_site.command("make")
def demo_site_make(
    directory: SiteDir,
    videos: Annotated[int, typer.Option(min=1, help="Narrated videos to generate.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the generated videos.")] = 0,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Write the demo site (videos, captions, pages, manifest) into DIR; same seed, same bytes."""
    from pipeline.demo import make_demo_media

    try:
        site = make_demo_media(directory, n_videos=videos, seed=seed, quiet=quiet)
    except RuntimeError as exc:  # a missing tool, or espeak-ng or ffmpeg failing
        _error(exc)
        raise typer.Exit(1) from None
    print(f"wrote {len(site.videos)} videos and {len(site.bad_pages)} bad pages to {site.out_dir}")


@demo_site.command("serve")
def demo_site_serve(
    directory: SiteDir,
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port (0: any free one).")] = 0,
) -> None:
    """Serve DIR over HTTP until interrupted: prints the base URL and writes DIR/urls.txt."""
    from pipeline.demo import serve_demo

    try:
        with serve_demo(directory, host=host, port=port) as base_url:
            print(base_url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                threading.Event().wait()
    except OSError as exc:  # no manifest.json (not a site), or the port is taken
        _error(f"cannot serve {directory}: {exc}")
        raise typer.Exit(1) from None


@app.command()
def transcript(
    file: Annotated[Path, typer.Argument(help=".vtt/.srt subtitles or a media file.",
                                         exists=True, dir_okay=False)],
    asr: Annotated[str, typer.Option(help="ASR backend for media files: faster-whisper or "
                                          "google.")] = "faster-whisper",
    model: Annotated[str | None, typer.Option(help="ASR model name or local path.")] = None,
) -> None:
    """Timed sentences of FILE, one JSON object per line."""
    from pipeline.config import AsrConfig, TranscribeConfig
    from pipeline.errors import SetupError, StageError
    from pipeline.transcribe import transcript_file

    setup_logging("quiet")
    try:
        options = AsrConfig(backend=asr, **({"model": model} if model else {}))
        rows = transcript_file(str(file), options, TranscribeConfig())
    except (StageError, SetupError, ValueError) as exc:
        _error(f"{file}: {exc}")
        raise typer.Exit(1) from None
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))


@app.command()
def validate(
    root: Annotated[str, typer.Argument(help="Corpus root.")],
    json_logs: JsonLogs = False,
) -> None:
    """Check every table against schemas/ and that no key is lost between stages."""
    from pipeline.validate import validate as check

    corpus = Corpus(root)
    problems = check(corpus)
    if json_logs:
        print(json.dumps({"root": root, "valid": not problems,
                          "violations": [str(p) for p in problems]}))
    elif problems:
        for problem in problems:
            _error(problem)
        console.print(f"{len(problems)} violations in {root}")
    else:
        console.print(f"{root}: valid ({', '.join(corpus.tables()) or 'no tables'})")
    if problems:
        raise typer.Exit(1)


@app.command()
def stats(
    root: Annotated[str, typer.Argument(help="Corpus root.")],
    json_logs: JsonLogs = False,
) -> None:
    """Rows per table and errors by stage and kind."""
    _emit(summarize(Corpus(root)), "json" if json_logs else "rich")


@app.command()
def report(root: Annotated[str, typer.Argument(help="Corpus root.")]) -> None:
    """Write report/stats.json and report/report.html."""
    from pipeline.report import write_report
    from pipeline.runner import StageContext

    result = write_report(StageContext(Corpus(root), config=None))
    console.print(f"wrote {result['html']} and {result['stats']}")


@app.command()
def migrate(
    root: Annotated[str, typer.Argument(help="Corpus root of the flat layout (before partitions).")],
    partitions: Annotated[int | None, typer.Option(min=1, help="Partitions (default: as a first "
                                                               "build would choose).")] = None,
) -> None:
    """Move a corpus of the flat layout into partitions, in place."""
    from pipeline.migrate import migrate as move

    report = move(Corpus(root), partitions)
    moved = ", ".join(f"{t} {n}" for t, n in report.rows.items()) or "nothing"
    console.print(f"{root}: {report.partitions} partitions; rows moved: {moved}")
    if report.shards_moved_to:
        console.print(f"old shards kept in {report.shards_moved_to}; the next build writes new ones")


@app.command()
def deploy(
    file: Annotated[Path, typer.Option(help="Prefect deployments file.", exists=True,
                                       dir_okay=False)] = Path("infra/prefect.yaml"),
    pool: Annotated[str | None, typer.Option(help="Work pool for all of them (default: each "
                                                  "deployment's own).")] = None,
    working_dir: Annotated[Path | None, typer.Option(
        envvar="VLCORPUS_WORKING_DIR",
        help="Folder the worker runs the flows in, holding flows/ and configs/ (default: the "
             "current directory).")] = None,
) -> None:
    """Register the deployments of FILE with the Prefect server of PREFECT_API_URL, creating
    their process work pool when it does not exist."""
    from flows.deploy import DeployError
    from flows.deploy import deploy as apply

    try:
        ids, directory = apply(file, working_dir or Path.cwd(), pool)
    except DeployError as exc:
        console.print(f"vlcorpus deploy: {exc}", style="red", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(f"registered {len(ids)} deployments from {file}; workers run them in {directory}",
                  highlight=False, soft_wrap=True)


def _target(target: str, root: str | None) -> tuple[Corpus, Config]:
    """A config file (its root, or --root), or a corpus root (its resolved config.yaml)."""
    path = Path(target)
    if path.is_file():
        cfg = load_config(path)
        return Corpus(cfg.corpus_root(root)), cfg
    corpus = Corpus(root or target)
    return corpus, load_config(corpus.local_path("config.yaml"))


def _on_target(target: str, root: str | None, run: Callable[[Corpus, Config], dict]) -> dict:
    """``run`` on the corpus and config of TARGET; unusable input exits 2 with its message."""
    setup_logging("rich")
    try:
        return run(*_target(target, root))
    except (ConfigError, ValueError, FileNotFoundError) as exc:
        _error(exc)
        raise typer.Exit(2) from None


def _require_training() -> None:
    from pipeline.setup import require_package

    try:
        require_package("torch", "training", extra="train")
    except SetupError as exc:
        _error(exc)
        raise typer.Exit(2) from None


Root = Annotated[str | None, typer.Option(help="Corpus root (default: the config's).")]
Device = Annotated[str, typer.Option(help="auto, cpu or cuda.")]
Pairs = Annotated[str | None, typer.Option(help="An external pairs file (parquet) instead of "
                                                 "the corpus's features; see README.")]
Shards = Annotated[str | None, typer.Option(help="Read features from shards (a WebDataset or "
                                                  "Parquet shard folder) instead of the tables.")]
EvalOn = Annotated[str, typer.Option("--eval-on", help="test: the test split (an error when there is "
                                     "none); all: every pair, training pairs included, recorded as "
                                     "split: all in metrics.json.")]


@app.command()
def train(
    target: Annotated[str, typer.Argument(help="A config file or a corpus root.")],
    root: Root = None,
    out: Annotated[Path | None, typer.Option(help="Checkpoints and metrics (default: "
                                                  "ROOT/train/<model>).")] = None,
    device: Device = "auto",
    resume: Annotated[bool, typer.Option(help="Continue from the newest checkpoint.")] = True,
    pairs: Pairs = None,
    shards: Shards = None,
    eval_on: EvalOn = "test",
) -> None:
    """Train the config's retrieval model on a corpus's features; prints metrics.json."""
    _require_training()
    from pipeline.train.run import train_corpus

    metrics = _on_target(target, root, lambda corpus, cfg: train_corpus(
        corpus, cfg, out, device=device, resume=resume, pairs_file=pairs, shards=shards, eval_on=eval_on))
    print(json.dumps({k: v for k, v in metrics.items() if k != "curve"}, default=str))


@app.command(name="eval")
def evaluate(
    target: Annotated[str, typer.Argument(help="A config file or a corpus root.")],
    checkpoint: Annotated[Path | None, typer.Option(help="Training folder or .pt file "
                                                         "(default: ROOT/train/<model>).")] = None,
    root: Root = None,
    device: Device = "auto",
    pairs: Pairs = None,
    shards: Shards = None,
    eval_on: EvalOn = "test",
) -> None:
    """Evaluate a trained retrieval model on the test split; prints its metrics."""
    _require_training()
    from pipeline.train.run import evaluate_corpus

    metrics = _on_target(target, root, lambda corpus, cfg: evaluate_corpus(
        corpus, cfg, checkpoint, device=device, pairs_file=pairs, shards=shards, eval_on=eval_on))
    print(json.dumps(metrics, default=str))


@app.command()
def schema(
    write: Annotated[bool, typer.Option("--write", help="Write schemas/config.schema.json instead "
                                                         "of printing it.")] = False,
) -> None:
    """The JSON schema of the YAML config (editors use it for completion and checks)."""
    from pipeline.config import SCHEMA_PATH, config_json_schema

    text = json.dumps(config_json_schema(), sort_keys=True, indent=2) + "\n"
    if write:
        SCHEMA_PATH.write_text(text, encoding="utf-8")
        console.print(f"wrote {SCHEMA_PATH}")
    else:
        print(text, end="")


if __name__ == "__main__":
    app()
