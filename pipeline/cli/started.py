"""When this process started, from the operating system: a build's set-up is measured from it,
whatever started the process (the ``vlcorpus`` script, ``python -m pipeline.cli``, a test), and
nothing above the command line has to hold it."""

from __future__ import annotations

import psutil


def process_started_at() -> float:
    """The process's start, in epoch seconds (10 ms resolution on Linux)."""
    return psutil.Process().create_time()
