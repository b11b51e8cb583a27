"""The garbage collector paused while a process imports what it needs.

Importing Prefect, Dask, torch or a test module makes about a million objects that live as long
as the process, and next to no garbage; the collector's passes over them were a fifth to a third
of the CPU of those imports (a Prefect server's start, a worker's preload, the checks of a build,
a test worker's collection). Afterwards the objects are frozen out of later collections, which
also spares a forked child from touching, and so copying, its parent's pages."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No collection while the block runs; then what it made is frozen (``gc.freeze``) and the
    collector is as it was."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
