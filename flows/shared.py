"""Prefect's backend of pipeline.download.limits: what tasks share across every worker and every build
on the server. Slots are global concurrency limits, rates are global concurrency limits with
slot decay (Prefect's rate limits), and stores are variables, updated under a limit of one slot.
Limits a task asks for are created (or resized) on first use in each process."""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from functools import cache

import certifi
from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import VariableCreate, VariableUpdate
from prefect.concurrency.sync import concurrency, rate_limit
from prefect.exceptions import ObjectAlreadyExists
from prefect.settings import PREFECT_API_SSL_CERT_FILE, PREFECT_API_TLS_INSECURE_SKIP_VERIFY

from pipeline.ids import safe_id
from pipeline.download.limits import Backend, State

_ensured: set[tuple[str, int, float | None]] = set()
_lock = threading.Lock()

# A held slot's lease, renewed by its holder while held: a killed holder's slot frees after a
# minute (the least the server takes; it sweeps every 15 s) instead of Prefect's default five,
# which the rerun of a killed build spent waiting for its own downloads' slots.
LEASE_S = 60.0


@cache
def _tls() -> ssl.SSLContext:
    """The TLS context of this process's clients, made once as Prefect makes it for each client
    (loading the CA bundle takes about 20 ms of CPU: a download asks the server a few times)."""
    if PREFECT_API_TLS_INSECURE_SKIP_VERIFY.value():
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=PREFECT_API_SSL_CERT_FILE.value() or certifi.where())


def client() -> SyncPrefectClient:
    """A client of the Prefect API (to use as a context manager) with the process's TLS context."""
    return get_client(httpx_settings={"verify": _tls()}, sync_client=True)


def ensure_limit(name: str, limit: int, decay_per_s: float | None = None) -> None:
    """The global concurrency limit ``name`` exists with this size (and slot decay)."""
    key = (name, limit, decay_per_s)
    # Held while creating: a download's threads that raced here each tried to create the limit,
    # and the server logged each conflict with a traceback.
    with _lock:
        if key in _ensured:
            return
        # ObjectAlreadyExists: another process created it at the same moment.
        with client() as api, suppress(ObjectAlreadyExists):
            api.upsert_global_concurrency_limit_by_name(name, limit, decay_per_s)
        _ensured.add(key)


@contextmanager
def prefect_slot(name: str, limit: int) -> Iterator[None]:
    """One slot of the Prefect global concurrency limit ``name``, which holds across every
    worker and every build on the server."""
    ensure_limit(name, limit)
    with concurrency(name, occupy=1, strict=True, lease_duration=LEASE_S):
        yield


def prefect_rate(name: str, per_minute: float, burst: int) -> None:
    """A turn of the Prefect rate limit ``name``: ``burst`` slots that free at ``per_minute``."""
    ensure_limit(name, burst, per_minute / 60)
    rate_limit(name, occupy=1, strict=True)


class PrefectStore:
    """States as Prefect variables ``<name>-<key>``; updates hold the one slot of the limit
    ``<name>-lock``, so that read, change and write are one step across processes."""

    def __init__(self, name: str) -> None:
        self.prefix = safe_id(name)  # variable names take letters, digits, - and _ only
        self.lock = f"{name}-lock"

    def read(self, keys: Sequence[str]) -> dict[str, State | None]:
        with client() as api:
            found = {key: api.read_variable_by_name(f"{self.prefix}-{key}") for key in keys}
        return {key: variable.value if variable else None for key, variable in found.items()}

    def update(self, key: str, change: Callable[[State | None], State]) -> State:
        name = f"{self.prefix}-{key}"
        ensure_limit(self.lock, 1)
        with concurrency(self.lock, occupy=1, strict=True, lease_duration=LEASE_S):
            with client() as api:
                variable = api.read_variable_by_name(name)
                state = change(variable.value if variable else None)
                if variable is None:
                    api.create_variable(VariableCreate(name=name, value=state))
                else:
                    api.update_variable(VariableUpdate(name=name, value=state))
        return state


PREFECT = Backend(slot=prefect_slot, rate=prefect_rate, store=PrefectStore)
