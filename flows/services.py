"""What a build runs on: a Prefect API (Prefect's temporary local server when none is
configured) and its Dask workers (flows/clusters/), started side by side (one after the other
they doubled a small build's fixed cost).

The server's address is chosen before either starts and given to the Dask worker processes,
so that they report to that server instead of starting servers of their own.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import (
    PREFECT_API_AUTH_STRING,
    PREFECT_API_URL,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    temporary_settings,
)

from flows import clusters
from flows.api_access import refusal
from flows.temporary_server import LOOPBACK, TemporaryServer
from pipeline.config import Config
from pipeline.errors import SetupError


def start_server(port: int | None = None) -> TemporaryServer:
    """Prefect's temporary local server, up and healthy, recording task runs and events for
    whoever reads them."""
    server = TemporaryServer(port, history=True)
    server.wait()
    return server


def drain() -> None:
    """Send this process's queued logs and events while the server is there to take them: once
    it is gone, Prefect's exit handler retries them without end and the process never exits."""
    APILogWorker.drain_all()
    EventsWorker.drain_all()


# The temporary servers this process runs, innermost last: builds inside the block that
# started one use it (the CLI starts it before it imports the flows, so the two overlap).
_servers: list[TemporaryServer] = []


@contextmanager
def prefect_server(early: TemporaryServer | None = None, host: str = LOOPBACK) -> Iterator[Callable[[], None]]:
    """Prefect's temporary server when no API is configured, starting (``early``, one the
    caller started before it could import Prefect, or a new one listening on ``host``); yields a
    function that waits until it is up (call it before the first API call). A configured server
    that refuses this process's credentials is refused in one line (SetupError)."""
    if _servers or PREFECT_API_URL.value():
        if early is not None:
            early.stop()
        refused = None if _servers else refusal(PREFECT_API_URL.value())
        if refused:
            raise SetupError(refused)
        yield _servers[-1].wait if _servers else lambda: None
        return
    server = early or TemporaryServer(host=host)
    _servers.append(server)
    try:
        # No flow-run heartbeats: nothing reads them once the server is gone with the build,
        # and their thread kept each flow's end waiting up to a second.
        with use_api(server.api_url, server.auth), temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
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
def use_api(api_url: str, auth: str | None = None) -> Iterator[None]:
    """This process and the processes it starts talk to ``api_url`` (with the auth string
    ``auth``). Prefect read its settings at import and keeps them per thread context: set them
    for this context and for the process-wide default, which threads started later (a download
    pool) fall back to."""
    from prefect.context import _temporary_global_settings_context, get_settings_context

    values = {"PREFECT_API_URL": api_url, **({"PREFECT_API_AUTH_STRING": auth} if auth else {})}
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    settings = {PREFECT_API_URL: api_url, **({PREFECT_API_AUTH_STRING: auth} if auth else {})}
    try:
        with temporary_settings(settings), _temporary_global_settings_context(get_settings_context()):
            yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextmanager
def build_services(cfg: Config, root: str, dask_address: str | None = None) -> Iterator[str]:
    """A Prefect API and the Dask cluster for a build (flows/clusters/, ``clusters.current()``
    while the block runs); yields the cluster's scheduler address."""
    with ExitStack() as stack:
        server_up = stack.enter_context(prefect_server(host=clusters.api_host(cfg, dask_address)))
        # Workers on other machines report to this server with the build's credentials.
        env = {setting.name: str(setting.value()) for setting in (PREFECT_API_URL, PREFECT_API_AUTH_STRING)
               if setting.value()}
        found = stack.enter_context(clusters.workers(cfg, root, dask_address, env))
        server_up()
        yield found.address
