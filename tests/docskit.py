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


def shell(lines: list[str], env: dict[str, str]) -> dict[str, str]:
    """Run commands of a page, as typed, one after the other in one shell at the repository's
    root (a `make secrets`, a `set -a && . FILE && set +a`); the environment they leave."""
    import subprocess

    done = subprocess.run(["bash", "-c", " && ".join([*lines, "env -0"])], cwd=ROOT, env=env,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    return dict(item.split("=", 1) for item in done.stdout.decode().split("\0") if "=" in item)
