"""The Dask cluster's backend of pipeline.download.limits, for builds on their own temporary Prefect
server (which nothing else shares, so limits there would hold no further than the cluster
does): slots are distributed Semaphores, stores are the scheduler's metadata updated under a
one-slot Semaphore, rates are token buckets in a store. The scheduler keeps them in memory, so
a slot costs a message on the worker's open connection. A Prefect slot costs a client, a lease
renewal thread and database writes on the server, whose SQLite answered about one write in
five with "database is locked" during a small build's downloads (Prefect's client retries
those after 2 s). A killed worker's slots free once their leases lapse
(``distributed.scheduler.locks.lease-timeout``, 30 s)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from distributed import Client, Semaphore, get_client

from pipeline.download.limits import Backend, State, decode, encode, store_rate

_lock = threading.Lock()
_semaphores: dict[tuple[str, str, int], Semaphore] = {}


def _semaphore(client: Client, name: str, limit: int) -> Semaphore:
    # One per client, name and size: each refreshes its leases on a timer of its own. The size
    # is in the scheduler's name because a Dask semaphore cannot be resized: builds that share
    # a cluster and a limit name share its slots when they agree on its size.
    with _lock:
        key = (client.id, name, limit)
        if key not in _semaphores:
            _semaphores[key] = Semaphore(max_leases=limit, name=f"vlcorpus-{name}-{limit}",
                                         scheduler_rpc=client.scheduler, loop=client.loop)
        return _semaphores[key]


class ClusterStore:
    """States in the scheduler's metadata under ``("vlcorpus", name, key)``, as JSON text (its
    messages would bring lists back as tuples); updates hold the store's one-slot semaphore, so
    read, change and write are one step across workers."""

    def __init__(self, client: Client, name: str) -> None:
        self.client = client
        self.name = name

    def read(self, keys: Sequence[str]) -> dict[str, State | None]:
        # The whole store in one message: the breaker reads every egress before each download.
        states = self.client.get_metadata(["vlcorpus", self.name], default={})
        return {key: decode(states.get(key)) for key in keys}

    def update(self, key: str, change: Callable[[State | None], State]) -> State:
        with _semaphore(self.client, f"{self.name}-lock", 1):
            text = encode(change(decode(self.client.get_metadata(["vlcorpus", self.name, key], default=None))))
            self.client.set_metadata(["vlcorpus", self.name, key], text)
        return decode(text)


def cluster_backend(client: Client | None = None) -> Backend:
    """Slots, rates and stores on the cluster of ``client``; by default the cluster of the task
    that calls it (its worker's client, which the threads a task starts cannot look up)."""
    client = client or get_client()

    @contextmanager
    def slot(name: str, limit: int) -> Iterator[None]:
        with _semaphore(client, name, limit):
            yield

    def store(name: str) -> ClusterStore:
        return ClusterStore(client, name)

    return Backend(slot=slot, rate=store_rate(store), store=store)
