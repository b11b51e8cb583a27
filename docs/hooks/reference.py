"""MkDocs hook: the reference pages, generated at each build from what they describe, so they
cannot drift: ``reference/config.md`` from ``schemas/config.schema.json`` and
``reference/cli.md`` from the ``vlcorpus`` command line."""

from __future__ import annotations

import json
from pathlib import Path

import cli_reference
import config_reference
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from pipeline.cli import app

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.json"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    files.append(File.generated(config, "reference/config.md", content=config_reference.render(schema)))
    files.append(File.generated(config, "reference/cli.md", content=cli_reference.render(app)))
    return files
