"""What a build runs on when nothing is given: Prefect's temporary local server and a local Dask
cluster, started side by side (one after the other they doubled a small build's fixed cost).

The server's address is chosen before either starts and given to the Dask worker processes,
so that they report to that server instead of starting servers of their own; the workers come
from a fork server of the build's (flows/fork_server.py) while the server comes up.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from typing import Any
from contextlib import ExitStack, contextmanager

from prefect.events.worker import EventsWorker
from prefect.logging.handlers import APILogWorker
from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

from flows.api_access import refusal
from flows.fork_server import WORKER_START, cluster_address, local_workers
from flows.temporary_server import TemporaryServer
from pipeline.config import Config
from pipeline.errors import SetupError
from pipeline.media.decode_pool import DECODE_WORKERS_ENV
from pipeline.compose.stages import gpu_stages

# Worker processes import the flows when they start (from the fork server, which has), not
# when the first task arrives.
PRELOAD = [WORKER_START]
# Where a local cluster serves its HTTP pages (health, metrics, the scheduler's view of its
# workers' logs): this machine's loopback, on any free port. Its scheduler and workers listen
# there too (LocalCluster's default host), except with threads, whose inproc transport names no
# host: their HTTP servers then took every interface.
PAGES = "127.0.0.1:0"


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
def prefect_server(early: TemporaryServer | None = None) -> Iterator[Callable[[], None]]:
    """Prefect's temporary server when no API is configured, starting (``early``, one the
    caller started before it could import Prefect, or a new one); yields a function that waits
    until it is up (call it before the first API call). A configured server that refuses this
    process's credentials is refused in one line (SetupError)."""
    if _servers or PREFECT_API_URL.value():
        if early is not None:
            early.stop()
        refused = None if _servers else refusal(PREFECT_API_URL.value())
        if refused:
            raise SetupError(refused)
        yield _servers[-1].wait if _servers else lambda: None
        return
    server = early or TemporaryServer()
    _servers.append(server)
    try:
        # No flow-run heartbeats: nothing reads them once the server is gone with the build,
        # and their thread kept each flow's end waiting up to a second.
        with use_api(server.api_url), temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
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


@contextmanager
def build_services(cfg: Config, root: str, dask_address: str | None = None) -> Iterator[str]:
    """A Prefect API and a Dask cluster for a build; yields the scheduler's address."""
    with ExitStack() as stack:
        server_up = stack.enter_context(prefect_server())
        address = cluster_address(cfg, dask_address)
        if address is None:
            import dask
            from distributed import LocalCluster

            # An in-memory root is only visible inside this process: threads, not processes.
            processes = not root.startswith("memory://")
            _no_dashboard_claim()
            # Workers see this process's environment as it is now (the server's address among
            # it), as spawned ones would: the fork server they come from may be older.
            workers = {"preload": PRELOAD, "env": dict(os.environ)} if processes else {}
            stack.enter_context(local_workers(cfg, root, dask_address))
            # Dask's housekeeping for a dashboard the local cluster does not start: the
            # statistical profiler samples every worker thread 100 times a second, the event
            # loops' tick (which warns of a loop blocked 3 s) runs 50 times a second, the system
            # monitor twice. An idle local cluster of 2 worker processes used 0.08 CPU-s a
            # second with the profiler off alone, 0.03 with all three (20 s idle, twice each); a
            # worker's memory is watched as often as before.
            stack.enter_context(dask.config.set({"distributed.worker.profile.enabled": False,
                                                 "distributed.admin.tick.interval": "1s",
                                                 "distributed.admin.system-monitor.interval": "2s"}))
            cluster = stack.enter_context(LocalCluster(
                n_workers=cfg.execution.n_workers or 2,
                threads_per_worker=cfg.execution.threads_per_worker, processes=processes,
                dashboard_address=None, scheduler_kwargs={"dashboard_address": PAGES},
                worker_dashboard_address=PAGES, **local_security(stack), **workers))
            if processes:
                add_gpu_workers(cluster, gpu_workers(cfg))
            address = cluster.scheduler_address
        server_up()
        yield address


def local_security(stack: ExitStack) -> dict[str, Any]:
    """A local cluster's TLS: none, unless this machine's Dask config requires encryption (a
    host that is a TLS cluster's client: infra/tls/client.env). Then the cluster gets
    certificates of its own, in memory (the config's are the other cluster's, and a client's
    alone), and this process's clients show them while ``stack`` is open."""
    import dask
    from distributed.security import Security

    if not Security().require_encryption:
        return {}
    security = Security.temporary()
    stack.enter_context(dask.config.set({
        "distributed.comm.tls.ca-file": security.tls_ca_file,
        "distributed.comm.tls.client.cert": security.tls_client_cert,
        "distributed.comm.tls.client.key": security.tls_client_key}))
    return {"security": security}


def gpu_workers(cfg: Config) -> int:
    """GPU workers a local cluster gets: one per visible GPU (counted through NVML, without
    initialising CUDA in this process) when a stage would run a model on one."""
    from pipeline.models.device import cuda_devices

    return cuda_devices() if gpu_stages(cfg) else 0


def add_gpu_workers(cluster: Any, gpus: int) -> None:
    """One worker per GPU beside the CPU workers, as on a real cluster (`dask worker
    --resources GPU=1`): it sees that GPU alone, offers the Dask resource GPU=1 that the GPU
    stages' tasks ask for, and its decode processes share the cores with the other GPUs'."""
    if not gpus:
        return
    from pipeline.media.decode_pool import usable_cpus

    per_gpu = str(max(1, usable_cpus() // gpus))
    for gpu in range(gpus):
        options = cluster.new_spec["options"]
        cluster.worker_spec[f"gpu-{gpu}"] = {**cluster.new_spec, "options": {
            **options, "name": f"gpu-{gpu}", "resources": {"GPU": 1},
            "env": {**options.get("env", {}), "CUDA_VISIBLE_DEVICES": str(gpu), DECODE_WORKERS_ENV: per_gpu}}}
    cluster.scale(len(cluster.worker_spec))
    cluster.wait_for_workers(len(cluster.worker_spec), timeout=120)


class _NoDashboard(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "dashboard is available" not in record.getMessage()


def _no_dashboard_claim() -> None:
    """prefect-dask announces the scheduler's HTTP address as "the Dask dashboard"; the local
    cluster starts none (and without bokeh there is none to start)."""
    logger = logging.getLogger("prefect.task_runner.dask")
    if not any(isinstance(f, _NoDashboard) for f in logger.filters):
        logger.addFilter(_NoDashboard())
