"""What a build runs on when nothing is given: Prefect's temporary local server and a local Dask
cluster, started side by side (each takes seconds; one after the other they doubled a small
build's fixed cost).

The server's address is chosen before either starts and put in the environment, so the Dask
worker processes inherit it and report to that server instead of starting servers of their
own; the workers import the flows while the server comes up.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings

from pipeline.config import Config

# Worker processes import these when they start, not when the first task arrives.
PRELOAD = ["flows.build"]


# Seconds the temporary server may take to come up: Prefect's default (20) fails builds on a
# busy machine, where importing the server and migrating its database take longer.
SERVER_STARTUP_S = 120


def start_server(port: int | None = None):
    """Prefect's temporary local server (a subprocess), started and healthy."""
    from prefect.server.api.server import SubprocessASGIServer

    # The server would otherwise try to reach Prefect's telemetry endpoint on every start.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    server = SubprocessASGIServer(port=port)
    server.start(timeout=SERVER_STARTUP_S)
    return server


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextmanager
def _server() -> Iterator[Callable[[], None]]:
    """Prefect's temporary server when no API is configured, starting in a thread; yields a
    function that waits until it is up (call it before the first API call)."""
    if PREFECT_API_URL.value():
        yield lambda: None
        return
    port = _free_port()
    servers: list = []
    failed: list[BaseException] = []

    def start() -> None:
        try:
            servers.append(start_server(port))
        except BaseException as exc:  # noqa: BLE001 - raised by wait(), in the caller's thread
            failed.append(exc)

    def wait() -> None:
        thread.join()
        if failed:
            raise failed[0]

    api_url = f"http://127.0.0.1:{port}/api"
    os.environ["PREFECT_API_URL"] = api_url
    thread = threading.Thread(target=start, name="prefect-server", daemon=True)
    thread.start()
    try:
        with temporary_settings({PREFECT_API_URL: api_url}):
            yield wait
    finally:
        thread.join()
        # Send the run's last logs while the server is still there to take them.
        APILogWorker.drain_all()
        os.environ.pop("PREFECT_API_URL", None)
        for server in servers:
            server.stop()


def cluster_address(cfg: Config, dask_address: str | None = None) -> str | None:
    """The Dask cluster a build should use: given, in the config, or the workers' environment
    (which lets a deployment's workers point every build at their cluster)."""
    return dask_address or cfg.execution.dask_address or os.environ.get("VLCORPUS_DASK_ADDRESS")


@contextmanager
def build_services(cfg: Config, root: str, dask_address: str | None = None) -> Iterator[str]:
    """A Prefect API and a Dask cluster for a build; yields the scheduler's address."""
    with ExitStack() as stack:
        server_up = stack.enter_context(_server())
        address = cluster_address(cfg, dask_address)
        if address is None:
            from distributed import LocalCluster

            # An in-memory root is only visible inside this process: threads, not processes.
            processes = not root.startswith("memory://")
            cluster = stack.enter_context(LocalCluster(
                n_workers=cfg.execution.n_workers or 2,
                threads_per_worker=cfg.execution.threads_per_worker, processes=processes,
                dashboard_address=None, **({"preload": PRELOAD} if processes else {})))
            address = cluster.scheduler_address
        server_up()
        yield address
