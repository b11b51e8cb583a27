"""Crashed runs of a deployment and their reruns, read back from its Prefect server: what the
tests of flows/rerun.py share, on SQLite (tests/flows/test_deploy.py) and on PostgreSQL
(tests/flows/test_rehearsal.py)."""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

T = TypeVar("T")


def wait_for(read: Callable[[], T], seconds: float = 120, why: Callable[[], str] = lambda: "nothing came") -> T:
    """``read()`` once it returns something true."""
    deadline = time.monotonic() + seconds
    while not (found := read()):
        assert time.monotonic() < deadline, why()
        time.sleep(0.5)
    return found


def crash(client: Any, deployment_id: UUID, name: str, times: int = 1, **parameters: Any) -> Any:
    """A run of the deployment, as a worker starts it, that ends Crashed ``times`` times (its
    worker and the server can both say so); the run."""
    from prefect.states import Crashed, Pending, Running

    run = client.create_flow_run_from_deployment(deployment_id, name=name, parameters=parameters)
    for state in (Pending(), Running(), *(Crashed(message="its process died") for _ in range(times))):
        client.set_flow_run_state(run.id, state, force=True)
    return client.read_flow_run(run.id)


def trigger_loaded(client: Any, deployment_id: UUID, why: Callable[[], str], every_s: float = 5,
                   seconds: float = 120) -> None:
    """Once the server evaluates crashes with the deployment's rerun trigger: a probe run is
    crashed every ``every_s`` until one of them is rerun. On PostgreSQL the server loads a new
    automation when PostgreSQL notifies it, or else at its next reconcile (every 5 s), and a
    crash it evaluated before then is never rerun. Prefect's listener of those notifications
    ends for good once it fails to reconnect, as when PostgreSQL restarts (PrefectHQ/prefect#21083:
    3.8 and 3.9 reconcile instead, and do not listen again)."""
    probes: list[Any] = []
    deadline = time.monotonic() + seconds
    next_probe = time.monotonic()
    while not any(reruns_of(client, deployment_id, probe) for probe in probes):
        assert time.monotonic() < deadline, why()
        if time.monotonic() >= next_probe:
            probes.append(crash(client, deployment_id, f"probe-{len(probes)}"))
            next_probe = time.monotonic() + every_s
        time.sleep(0.5)


def reruns_of(client: Any, deployment_id: UUID, crashed: Any) -> list:
    """The runs of the deployment that run ``crashed`` again."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
        deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id])), limit=200)
    return [run for run in runs if run.parameters.get("rerun_of") == str(crashed.id)]


def claims_at_once(runs: list, crashed: Any) -> list[str | None]:
    """What ``flows.siblings.repeated`` says for each of ``runs``, reruns of ``crashed``, asked
    at the same moment from a thread each (None: the run claimed the crash and builds)."""
    from flows.siblings import repeated

    start = threading.Barrier(len(runs))
    said: list[str | None] = [None] * len(runs)

    def claim(i: int) -> None:
        start.wait()
        said[i] = repeated(runs[i], crashed)

    # Each in this thread's context: the Prefect settings that name the server.
    threads = [threading.Thread(target=contextvars.copy_context().run, args=(claim, i)) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return said
