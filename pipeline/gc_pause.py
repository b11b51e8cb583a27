"""The garbage collector paused while a process imports what it needs, and its full passes
spaced out afterwards.

Importing Prefect, Dask, torch or a test module makes about a million objects that live as long
as the process, and next to no garbage; the collector's passes over them were a fifth to a third
of the CPU of those imports (a Prefect server's start, a worker's preload, the checks of a build,
a test worker's collection). Afterwards the objects are frozen out of later collections, which
also spares a forked child from touching, and so copying, its parent's pages.

What a process makes after that (a build's Prefect client and Dask cluster, the server's
database engine and the models FastAPI builds on first use) lives long too, and the full passes
over it, one every second or two at the default pace, were 6 to 10 % of the CPU of a small
build's process and of its Prefect server (0.5 s of 5.4 and 8.0 CPU-s). So a process that has
paused the collector for its imports has its full passes ten times further apart from then on;
the two young generations, where most garbage cycles die, are collected as often as before.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


# Collections of the middle generation between two full ones; Python's default is 10.
MIDDLE_PER_FULL = 100


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection while the block runs; then what it made is frozen (``gc.freeze``), the
    full passes are ``MIDDLE_PER_FULL`` middle ones apart for the rest of the process, and the
    collector is enabled as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        young, middle, _ = gc.get_threshold()
        gc.set_threshold(young, middle, MIDDLE_PER_FULL)
        if enabled:
            gc.enable()
