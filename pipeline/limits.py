"""Concurrency limits shared by every task: cluster-wide on Dask, process-wide otherwise."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_semaphores: dict[tuple[str, int], Any] = {}


def _semaphore(name: str, limit: int) -> Any:
    with _lock:
        key = (name, limit)
        if key not in _semaphores:
            _semaphores[key] = _cluster_semaphore(name, limit) or threading.BoundedSemaphore(limit)
        return _semaphores[key]


def _cluster_semaphore(name: str, limit: int) -> Any:
    """A Dask semaphore when running on a Dask worker, so the limit holds across workers."""
    try:
        from distributed import Semaphore, get_worker
    except ImportError:
        return None
    try:
        get_worker()
    except ValueError:
        return None
    return Semaphore(max_leases=limit, name=f"vlcorpus-{name}-{limit}")


@contextmanager
def slot(name: str, limit: int) -> Iterator[None]:
    """Hold one of ``limit`` slots named ``name`` for the duration of the block."""
    semaphore = _semaphore(name, limit)
    semaphore.acquire()
    try:
        yield
    finally:
        semaphore.release()
