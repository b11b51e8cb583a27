"""The Dask cluster's backend of pipeline.download.limits (flows/cluster_limits.py), which builds on their
own temporary Prefect server use, on a real cluster of two worker processes: slots, stores and
rates hold across the processes, and a client outside the workers (the flow's) sees the same
states. The process backend's rate is checked the same way across threads. Each backend's store
reads back what was written (lists as lists), so the breaker trips any number of times on it."""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import cloudpickle
import pytest
from distributed import Client, LocalCluster

from flows.cluster_limits import cluster_backend
from flows.clusters import scheduler_workers
from pipeline.download.breaker import Policy, refused
from pipeline.download.limits import PROCESS

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=3, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        yield client


def _spread(client: Client, fn, *args, each: int) -> list:
    """``fn(*args)`` ``each`` times on each of the two worker processes at once; the results in
    one list."""
    workers = scheduler_workers(client)
    assert len(workers) == 2, workers
    futures = [client.submit(fn, *args, workers=[worker], pure=False) for worker in workers for _ in range(each)]
    return client.gather(futures)


def _hold(name: str, limit: int) -> tuple[float, float]:
    with cluster_backend().slot(name, limit):
        start = time.time()
        time.sleep(0.3)
        return start, time.time()


def _count(name: str, times: int) -> None:
    store = cluster_backend().store(name)

    def add(state):
        time.sleep(0.01)  # between read and write: an update without the lock would be lost
        return {"n": (state or {"n": 0})["n"] + 1}

    for _ in range(times):
        store.update("counter", add)


def _turns(rate, name: str, turns: int) -> tuple[float, list[float]]:
    asked = time.time()
    given = []
    for _ in range(turns):
        rate(name, 600, 2)
        given.append(time.time())
    return asked, given


def _cluster_turns(name: str, turns: int) -> tuple[float, list[float]]:
    return _turns(cluster_backend().rate, name, turns)


def _check_rate(results: list[tuple[float, list[float]]]) -> None:
    # 600 a minute with a burst of 2: over any T seconds from the first ask, at most 2 + 10 T turns.
    first = min(asked for asked, _ in results)
    given = sorted(t for _, times in results for t in times)
    for k, at in enumerate(given, start=1):
        assert at - first >= (k - 2) / 10 - 0.02, f"turn {k} came {at - first:.2f} s after the first ask"


def test_slots_hold_across_worker_processes(client):
    spans = _spread(client, _hold, "slots", 2, each=3)
    # The holders at each moment a slot was taken (the most there ever were is at one of them).
    # Counting the starts inside each span instead counts one that ended before a later start.
    overlap = max(sum(s <= at < e for s, e in spans) for at, _ in spans)
    assert overlap == 2, f"{overlap} of 6 held a slot of 2 at once"


def test_store_updates_are_atomic_across_worker_processes_and_seen_outside(client):
    _spread(client, _count, "counts", 5, each=2)
    outside = cluster_backend(client).store("counts")
    assert outside.read(["counter", "never-written"]) == {"counter": {"n": 20}, "never-written": None}


def test_rate_turns_are_paced_across_worker_processes(client):
    _check_rate(_spread(client, _cluster_turns, "turns", 4, each=1))


def test_process_rate_turns_are_paced_across_threads():
    with ThreadPoolExecutor(3) as pool:
        _check_rate(list(pool.map(lambda _: _turns(PROCESS.rate, "process-turns", 3), range(3))))


# Every JSON type, lists nested in lists as the breaker keeps its pauses.
STATE = {"events": [[1.5, "3f2a"]], "pauses": [[1.0, 2.0], [3.0, 5.0]], "since": None,
         "trips": 2, "ok": True, "egress": "direct", "nested": {"list": [1, [2, "x"]]}}


def _written_and_read(store) -> tuple:
    updated = store.update("state", lambda _: STATE)
    return updated, store.read(["state"])["state"]


def _trips(store, trips: int) -> dict:
    """The breaker tripped ``trips`` times through ``store``, each refusal a new trip."""
    policy = Policy(threshold=1, cooldown_s=1, cooldown_max_s=2)
    start = time.time()
    for n in range(trips):
        at = start + 10 * n  # after the last pause: a refusal of a download let through then
        store.update("direct", lambda s, n=n, at=at: refused(s, f"video-{n}", True, at, at, policy))
    return store.read(["direct"])["direct"]


def _on_worker(fn, name: str, *args):
    return fn(cluster_backend().store(name), *args)


def _check_store(written_and_read, tripped) -> None:
    # Equal as written, lists included ([1] != (1,)), and the breaker trips again and again.
    assert written_and_read == (STATE, STATE)
    assert tripped["trips"] == 4 and len(tripped["pauses"]) == 4
    assert all(type(p) is list for p in tripped["pauses"])


def test_cluster_store_reads_back_what_was_written_across_worker_processes(client):
    worker = next(iter(scheduler_workers(client)))
    written = client.submit(_on_worker, _written_and_read, "types", workers=[worker], pure=False).result()
    tripped = client.submit(_on_worker, _trips, "trips", 4, workers=[worker], pure=False).result()
    _check_store(written, tripped)
    # Read outside the worker (the flow's client), the same.
    assert cluster_backend(client).store("trips").read(["direct"])["direct"] == tripped


def test_process_store_reads_back_what_was_written():
    _check_store(_written_and_read(PROCESS.store("types")), _trips(PROCESS.store("trips"), 4))


@pytest.mark.slow
def test_prefect_store_reads_back_what_was_written(prefect_server):
    from flows.shared import PrefectStore

    _check_store(_written_and_read(PrefectStore("types")), _trips(PrefectStore("trips"), 4))
