"""Concurrency limits shared by every task: process-wide by default; a runner that spreads
tasks over a cluster installs a cluster-wide backend (flows/ installs Prefect's global
concurrency limits)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

Backend = Callable[[str, int], AbstractContextManager[None]]

_lock = threading.Lock()
_semaphores: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_backend: Backend | None = None
_users = 0


@contextmanager
def using(backend: Backend) -> Iterator[None]:
    """Take every slot of this process from ``backend(name, limit)`` while the block runs; the
    blocks of tasks running side by side in one process nest (the last one out restores)."""
    global _backend, _users
    with _lock:
        _backend, _users = backend, _users + 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                _backend = None


@contextmanager
def _process_slot(name: str, limit: int) -> Iterator[None]:
    with _lock:
        semaphore = _semaphores.setdefault((name, limit), threading.BoundedSemaphore(limit))
    with semaphore:
        yield


def slot(name: str, limit: int) -> AbstractContextManager[None]:
    """Hold one of ``limit`` slots named ``name`` for the duration of the block."""
    return (_backend or _process_slot)(name, limit)
