"""``vlcorpus fetch-models``: the published models a config needs, into the libraries' caches
ahead of a build (pipeline/models/fetch.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pipeline.cli.common import _error, app
from pipeline.config import ConfigError, load_config
from pipeline.progress import setup_logging, stdout_console


@app.command("fetch-models")
def fetch_models(
    config: Annotated[Path, typer.Argument(help="YAML config file.", exists=True, dir_okay=False)],
) -> None:
    """Download every published model CONFIG's stages need (torchvision weights, Hugging Face
    text encoders, the Whisper model) into the libraries' caches (TORCH_HOME, HF_HOME), for
    builds whose workers have no internet: run it where the hubs are reachable, then share or
    copy the caches. One line per model; exit 0 when all are there, 2 otherwise."""
    setup_logging("quiet")
    try:
        cfg = load_config(config)
    except (ConfigError, ValueError) as exc:
        _error(exc)
        raise typer.Exit(2) from None
    from pipeline.models.fetch import fetch_models as fetch

    out = stdout_console()
    failed = 0
    for fetched in fetch(cfg):
        failed += fetched.status == "failed"
        out.print(fetched.line(), style="red" if fetched.status == "failed" else None, soft_wrap=True,
                  markup=False, highlight=False)
    if failed:
        raise typer.Exit(2)
