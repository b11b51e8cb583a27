"""The local cluster: Dask worker processes on this machine, forked from the build's fork server
(flows/clusters/fork_server.py), with one more worker per GPU that sees it alone; threads for an
in-memory root, which only this process sees."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from flows.clusters.fork_server import WORKER_START, fork_server, stop
from pipeline.config import Config
from pipeline.compose.stages import gpu_stages
from pipeline.media.decode_pool import DECODE_WORKERS_ENV

# Worker processes import the flows when they start (from the fork server, which has), not
# when the first task arrives.
PRELOAD = [WORKER_START]
# Where a local cluster serves its HTTP pages (health, metrics, the scheduler's view of its
# workers' logs): this machine's loopback, on any free port. Its scheduler and workers listen
# there too (LocalCluster's default host), except with threads, whose inproc transport names no
# host: their HTTP servers then took every interface.
PAGES = "127.0.0.1:0"


def in_threads(root: str) -> bool:
    """An in-memory root is only visible inside this process: its workers are threads."""
    return root.startswith("memory://")


@contextmanager
def forked_workers(root: str) -> Iterator[None]:
    """The fork server the local cluster's worker processes come from, for this block (none for
    threads)."""
    if in_threads(root):
        stop()  # one the command line started before it knew
        yield
        return
    with fork_server():
        yield


@contextmanager
def local_cluster(cfg: Config, root: str) -> Iterator[str]:
    """A local cluster for a build of ``cfg`` on ``root``, up; yields its scheduler's address."""
    import dask
    from distributed import LocalCluster

    processes = not in_threads(root)
    with ExitStack() as stack:
        # Workers see this process's environment as it is now (the server's address among it),
        # as spawned ones would: the fork server they come from may be older.
        workers = {"preload": PRELOAD, "env": dict(os.environ)} if processes else {}
        stack.enter_context(forked_workers(root))
        # Dask's housekeeping for a dashboard the local cluster does not start: the statistical
        # profiler samples every worker thread 100 times a second, the event loops' tick (which
        # warns of a loop blocked 3 s) runs 50 times a second, the system monitor twice. An idle
        # local cluster of 2 worker processes used 0.08 CPU-s a second with the profiler off
        # alone, 0.03 with all three (20 s idle, twice each); a worker's memory is watched as
        # often as before.
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
        yield cluster.scheduler_address


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
