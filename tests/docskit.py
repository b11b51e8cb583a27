"""The code blocks of the documentation pages, for the tests that run them as written."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@dataclass(frozen=True)
class Block:
    language: str
    title: str | None  # a ``title="..."`` in the fence's info string: the file it shows
    text: str


def code_blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, in page order."""
    blocks = []
    for token in MarkdownIt().parse(page.read_text(encoding="utf-8")):
        if token.type != "fence":
            continue
        language, *attributes = shlex.split(token.info) or [""]
        title = next((a.split("=", 1)[1] for a in attributes if a.startswith("title=")), None)
        blocks.append(Block(language, title, token.content))
    return blocks


def commands(block: Block) -> list[str]:
    """The commands of a shell block: one a line, comments and blank lines left out."""
    return [line.split(" #", 1)[0].strip() for line in block.text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
