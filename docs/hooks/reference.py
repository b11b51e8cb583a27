"""The reference pages, ``docs/reference/config.md`` from ``schemas/config.schema.json`` and
``docs/reference/cli.md`` from the ``vlcorpus`` command line. They are committed, so that their
links work where the Markdown is read on GitHub too; ``make reference`` (this file run as a
script) writes them, and as a MkDocs hook it stops a site build whose pages are stale, so they
cannot drift from what they describe."""

from __future__ import annotations

import json
from pathlib import Path

import cli_reference
import config_reference

from pipeline.cli import app

DOCS = Path(__file__).resolve().parents[1]
SCHEMA = DOCS.parent / "schemas" / "config.schema.json"


def pages() -> dict[Path, str]:
    """Each reference page's path and the Markdown it should hold."""
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    return {DOCS / "reference" / "config.md": config_reference.render(schema),
            DOCS / "reference" / "cli.md": cli_reference.render(app)}


def stale() -> list[Path]:
    """The reference pages whose file is missing or differs from what it should hold."""
    return [path for path, text in pages().items()
            if not path.is_file() or path.read_text(encoding="utf-8") != text]


def on_pre_build(config: object) -> None:
    from mkdocs.exceptions import PluginError

    found = stale()
    if found:
        raise PluginError(f"stale reference pages: {', '.join(map(str, found))}; run `make reference`")


if __name__ == "__main__":
    for path, text in pages().items():
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path}")
