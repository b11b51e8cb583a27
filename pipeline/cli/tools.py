"""Commands around the pipeline rather than on a corpus: ``init`` (a starter config),
``schema`` (the config's JSON schema), ``deploy`` (Prefect deployments), ``transcript`` (one
file's timed sentences) and ``demo-site`` (the demo videos and their site, alone)."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import _error, app, console
from pipeline.progress import setup_logging


@app.command()
def init(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The corpus's name; writes NAME.yaml.")],
    style: Annotated[str, typer.Option(help="howto100m, apartment_tour or spoken_moments (as in "
                                            "configs/; apartment-tour works too).")] = "howto100m",
    out: Annotated[Path, typer.Option(help="Folder to write NAME.yaml in.")] = Path("."),
) -> None:
    """Write a commented starter config for a corpus style (never over an existing file)."""
    from pipeline.starter import StarterError, style_name, write_starter

    try:
        style = style_name(style)
        path = write_starter(name, style, out)
    except StarterError as exc:
        _error(exc)
        raise typer.Exit(2) from None
    console.print(f"wrote {path} ({style}); edit its sources and root, then: vlcorpus build {path}",
                  highlight=False)


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
    name: Annotated[list[str] | None, typer.Option(
        "--name", help="Register only this deployment (repeat for several).")] = None,
) -> None:
    """Register the deployments of FILE with the Prefect server of PREFECT_API_URL, creating
    their process work pool when it does not exist, and the server's automation that marks a
    run Crashed once its heartbeats stop. Each is checked first (config, root, source files,
    schedules, liveness); if one could not run, none is registered (exit 2)."""
    from flows.deploy import DeployError
    from flows.deploy import deploy as apply

    try:
        ids, directory = apply(file, working_dir or Path.cwd(), pool, name)
    except DeployError as exc:
        for line in str(exc).splitlines():
            console.print(f"vlcorpus deploy: {line}", style="red", highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    console.print(f"registered {len(ids)} deployment{'' if len(ids) == 1 else 's'} from {file}; "
                  f"workers run them in {directory}",
                  highlight=False, soft_wrap=True)


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
    from pipeline.transcribe.stage import transcript_file

    setup_logging("quiet")
    try:
        options = AsrConfig(backend=asr, **({"model": model} if model else {}))
        rows = transcript_file(str(file), options, TranscribeConfig())
    except (StageError, SetupError, ValueError) as exc:
        _error(f"{file}: {exc}")
        raise typer.Exit(1) from None
    for row in rows:
        print(json.dumps(row, ensure_ascii=False))


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
