"""The ``vlcorpus`` command line (DESIGN.md: interfaces that stay stable).

``common.py`` holds the one typer ``app`` and what commands share; each other module registers
its group of commands on it when imported, in the order ``--help`` lists them.
"""

from pipeline.cli import build, check, models, corpus, train, tools  # noqa: F401 - registers the commands
from pipeline.cli.common import _emit, app

__all__ = ["_emit", "app"]
