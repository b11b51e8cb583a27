"""What tasks running side by side share: concurrency slots, request rates, and small named
states (the download breaker's). Process-wide by default; a runner that spreads tasks over a
cluster installs a cluster-wide backend (flows/ installs Prefect's global concurrency limits,
rate limits and variables, or the Dask cluster's semaphores and metadata)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

State = dict[str, Any]  # JSON-able, so that a cluster-wide store can hold it


def encode(state: State) -> str:
    """A state as a store keeps it: JSON text, which every backend carries unchanged (the Dask
    scheduler's messages turn lists into tuples, so a state read back would differ)."""
    return json.dumps(state, separators=(",", ":"))


def decode(text: str | None) -> State | None:
    """A state read back, with the types it was written with (lists stay lists)."""
    return None if text is None else json.loads(text)


class Store(Protocol):
    """Small JSON states under string keys, updated atomically."""

    def read(self, keys: Sequence[str]) -> dict[str, State | None]:
        """The state of each key (None for a key never written)."""

    def update(self, key: str, change: Callable[[State | None], State]) -> State:
        """Replace the state of ``key`` with ``change(state)``, with no other update of the
        store in between; returns the new state."""


@dataclass(frozen=True)
class Backend:
    slot: Callable[[str, int], AbstractContextManager[None]]  # (name, limit)
    rate: Callable[[str, float, int], None]  # (name, per minute, burst): waits for a turn
    store: Callable[[str], Store]  # name -> the store of that name


_lock = threading.Lock()
_backend: Backend | None = None
_users = 0


@contextmanager
def using(backend: Backend) -> Iterator[None]:
    """Share slots, rates and stores through ``backend`` while the block runs; the blocks of
    tasks running side by side in one process nest (the last one out restores)."""
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


_semaphores: dict[tuple[str, int], threading.BoundedSemaphore] = {}


@contextmanager
def _process_slot(name: str, limit: int) -> Iterator[None]:
    with _lock:
        semaphore = _semaphores.setdefault((name, limit), threading.BoundedSemaphore(limit))
    with semaphore:
        yield


def _turn(state: State | None, per_minute: float, burst: int, now: float) -> State:
    # A token bucket where each caller takes its token at once (the count may go below zero)
    # and then waits until it is due, so callers are served in the order they came.
    per_second = per_minute / 60
    tokens = float(burst)
    if state is not None:
        tokens = min(tokens, state["tokens"] + (now - state["at"]) * per_second)
    return {"tokens": tokens - 1, "at": now}


def store_rate(stores: Callable[[str], Store]) -> Callable[[str, float, int], None]:
    """Rates kept as token buckets in the stores of ``stores``: as shared as those are."""

    def rate(name: str, per_minute: float, burst: int) -> None:
        state = stores(f"{name}-rate").update("bucket", lambda s: _turn(s, per_minute, burst, time.time()))
        if state["tokens"] < 0:
            time.sleep(-state["tokens"] * 60 / per_minute)

    return rate


class _ProcessStore:
    """States kept encoded, as the cluster's are: a caller never shares a list with the store,
    and a state that is not JSON fails here as it would on a cluster."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, str] = {}

    def read(self, keys: Sequence[str]) -> dict[str, State | None]:
        with self._lock:
            return {key: decode(self._states.get(key)) for key in keys}

    def update(self, key: str, change: Callable[[State | None], State]) -> State:
        with self._lock:
            self._states[key] = encode(change(decode(self._states.get(key))))
            return decode(self._states[key])


_stores: dict[str, _ProcessStore] = {}


def _process_store(name: str) -> Store:
    with _lock:
        return _stores.setdefault(name, _ProcessStore())


PROCESS = Backend(slot=_process_slot, rate=store_rate(_process_store), store=_process_store)


def _current() -> Backend:
    return _backend or PROCESS


def slot(name: str, limit: int) -> AbstractContextManager[None]:
    """Hold one of ``limit`` slots named ``name`` for the duration of the block."""
    return _current().slot(name, limit)


def rate(name: str, per_minute: float, burst: int) -> None:
    """Wait for a turn of the rate ``name``: ``per_minute`` turns a minute, and up to ``burst``
    at once after a quiet spell."""
    _current().rate(name, per_minute, burst)


def store(name: str) -> Store:
    """The shared store named ``name``."""
    return _current().store(name)
