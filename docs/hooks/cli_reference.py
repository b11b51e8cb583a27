"""The command-line reference page, rendered from the ``vlcorpus`` typer app by typer's own
Markdown generator (what ``typer pipeline.cli utils docs`` prints), so that every command and
option the CLI has is on the page, as its ``--help`` says it."""

from __future__ import annotations

import typer
import typer.main
from typer.cli import get_docs_for_click

_INTRO = """# Command-line reference

Every `vlcorpus` command with its arguments and options, generated from the command line
itself each time the site is built (`vlcorpus COMMAND --help` prints the same). The commands
that stay stable are listed in [Architecture](../architecture.md); how they fit together is in
[Getting started](../getting-started.md) and [Building a corpus](../running.md).
"""


def render(app: typer.Typer, name: str = "vlcorpus") -> str:
    """The whole reference page as Markdown: one section per command, nested as the CLI is."""
    command = typer.main.get_command(app)
    context = typer.Context(command, info_name=name)
    body = get_docs_for_click(obj=command, ctx=context, name=name, title=f"`{name}`")
    # typer heads the app with "#": a level down, under the page's own title.
    return _INTRO + "\n" + "\n".join(f"#{line}" if line.startswith("#") else line
                                     for line in body.splitlines()) + "\n"
