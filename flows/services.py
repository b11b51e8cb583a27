"""What a build runs on when nothing is given: Prefect's temporary local server and a local Dask
cluster, started side by side (each takes seconds; one after the other they doubled a small
build's fixed cost).

The server's address is chosen before either starts and put in the environment, so the Dask
worker processes inherit it and report to that server instead of starting servers of their
own; the workers import the flows while the server comes up.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress

from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, temporary_settings

from pipeline.config import Config

# Worker processes import these when they start, not when the first task arrives.
PRELOAD = ["flows.build"]


# Seconds the temporary server may take to come up: Prefect's default (20) fails builds on a
# busy machine, where importing the server and migrating its database take longer.
SERVER_STARTUP_S = 120


class TemporaryServer:
    """Prefect's temporary local server, run the way Prefect runs it (uvicorn on the server's
    app factory, ephemeral mode, no UI) but started without importing the server into this
    process: that import alone took about 3 s of a small build's start, on the same core as
    the build's own imports. ``wait()`` returns once it answers its health check."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.api_url = f"http://127.0.0.1:{self.port}/api"
        package = importlib.util.find_spec("prefect").submodule_search_locations[0]
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT__SERVER_FINAL": "1",
               # The server would otherwise try to reach Prefect's telemetry endpoint.
               "PREFECT_SERVER_ANALYTICS_ENABLED": os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED", "false")}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", os.path.dirname(package), "--factory",
             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(self.port),
             "--log-level", "error", "--lifespan", "on"], env=env)

    def wait(self, timeout_s: float = SERVER_STARTUP_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            # OSError: not listening yet; look again below, unless it died or took too long.
            with suppress(OSError), \
                    urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
            if self.process.poll() is not None:
                raise RuntimeError(f"Prefect's temporary server exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Prefect's temporary server did not answer within {timeout_s:.0f} s")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_server(port: int | None = None) -> TemporaryServer:
    """Prefect's temporary local server, up and healthy."""
    server = TemporaryServer(port)
    server.wait()
    return server


def drain() -> None:
    """Send this process's queued logs and events while the server is there to take them: once
    it is gone, Prefect's exit handler retries them without end and the process never exits."""
    APILogWorker.drain_all()
    EventsWorker.drain_all()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# The temporary servers this process runs, innermost last: builds inside the block that
# started one use it (the CLI starts it before it imports the flows, so the two overlap).
_servers: list[TemporaryServer] = []


@contextmanager
def prefect_server() -> Iterator[Callable[[], None]]:
    """Prefect's temporary server when no API is configured, starting; yields a function that
    waits until it is up (call it before the first API call)."""
    if _servers:
        yield _servers[-1].wait
        return
    if PREFECT_API_URL.value():
        yield lambda: None
        return
    server = TemporaryServer()
    _servers.append(server)
    try:
        with use_api(server.api_url):
            yield server.wait
    finally:
        _servers.pop()
        drain()
        server.stop()


def on_temporary_server() -> bool:
    """Whether this process talks to a temporary server it started: one build's own, which
    nothing else shares."""
    return any(server.api_url == PREFECT_API_URL.value() for server in _servers)


@contextmanager
def use_api(api_url: str) -> Iterator[None]:
    """This process and the processes it starts talk to ``api_url``. Prefect read its settings
    at import and keeps them per thread context: set them for this context and for the
    process-wide default, which threads started later (a download pool) fall back to."""
    from prefect.context import _temporary_global_settings_context, get_settings_context

    before = os.environ.get("PREFECT_API_URL")
    os.environ["PREFECT_API_URL"] = api_url
    try:
        with temporary_settings({PREFECT_API_URL: api_url}), \
                _temporary_global_settings_context(get_settings_context()):
            yield
    finally:
        if before is None:
            os.environ.pop("PREFECT_API_URL", None)
        else:
            os.environ["PREFECT_API_URL"] = before


def cluster_address(cfg: Config, dask_address: str | None = None) -> str | None:
    """The Dask cluster a build should use: given, in the config, or the workers' environment
    (which lets a deployment's workers point every build at their cluster)."""
    return dask_address or cfg.execution.dask_address or os.environ.get("VLCORPUS_DASK_ADDRESS")


@contextmanager
def build_services(cfg: Config, root: str, dask_address: str | None = None) -> Iterator[str]:
    """A Prefect API and a Dask cluster for a build; yields the scheduler's address."""
    with ExitStack() as stack:
        server_up = stack.enter_context(prefect_server())
        address = cluster_address(cfg, dask_address)
        if address is None:
            from distributed import LocalCluster

            # An in-memory root is only visible inside this process: threads, not processes.
            processes = not root.startswith("memory://")
            _no_dashboard_claim()
            cluster = stack.enter_context(LocalCluster(
                n_workers=cfg.execution.n_workers or 2,
                threads_per_worker=cfg.execution.threads_per_worker, processes=processes,
                dashboard_address=None, **({"preload": PRELOAD} if processes else {})))
            address = cluster.scheduler_address
        server_up()
        yield address


class _NoDashboard(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "dashboard is available" not in record.getMessage()


def _no_dashboard_claim() -> None:
    """prefect-dask announces the scheduler's HTTP address as "the Dask dashboard"; the local
    cluster starts none (and without bokeh there is none to start)."""
    logger = logging.getLogger("prefect.task_runner.dask")
    if not any(isinstance(f, _NoDashboard) for f in logger.filters):
        logger.addFilter(_NoDashboard())
