"""Where a build's Dask workers come from, behind one interface: ``workers(cfg, root,
dask_address)`` yields the cluster a build runs on, whatever its kind.

- ``local`` (the default): worker processes forked on this machine from the build's fork server,
  one more per GPU (flows/clusters/local.py, fork_server.py);
- ``address``: a scheduler that is running already, with its workers (``--dask-address``,
  ``execution.dask_address``, a deployment's ``VLCORPUS_DASK_ADDRESS``);
- ``slurm``: a scheduler in the build's process, and its CPU and GPU workers as SLURM jobs that
  follow the work (flows/clusters/slurm.py, scaling.py).

Which one: ``--dask-address`` on the command line, else the config's ``execution.cluster`` (or
its shorthand ``execution.dask_address``), else a deployment worker's ``VLCORPUS_DASK_ADDRESS``,
else the local cluster. The same corpus config runs on each.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ContextManager

from flows.clusters import fork_server
from pipeline.config import Config
from pipeline.config.cluster import AddressCluster, Cluster, LocalCluster, SlurmCluster

if TYPE_CHECKING:
    from distributed import Client

ADDRESS_ENV = "VLCORPUS_DASK_ADDRESS"


@dataclass
class Workers:
    """The cluster a build runs on.

    ``address``: its scheduler. ``local``: its workers are this machine's own, so the build's
    corpus-wide steps run in the build's process as before; elsewhere they run on the cluster
    (a login node runs no stage). ``pools``: the workers are split in a CPU and a GPU pool, so
    every task asks for the resource of its pool (CPU=1 or GPU=1), and the GPU pool's jobs come
    when GPU tasks wait. ``status``: a line on its jobs for the progress, or None. ``failure``:
    why the build cannot go on (a job that cannot start), or None."""

    address: str
    kind: str
    local: bool = False
    pools: bool = False
    gpu_pool: bool = False
    status: Callable[[], str | None] = lambda: None
    failure: Callable[[], str | None] = lambda: None

    def resources(self, gpu: bool) -> dict[str, int]:
        """What a task asks the scheduler for: GPU=1 for a GPU task, and on pooled workers CPU=1
        for the others (no GPU job runs a download)."""
        if gpu:
            return {"GPU": 1}
        return {"CPU": 1} if self.pools else {}


_current: list[Workers] = []


def current() -> Workers | None:
    """The cluster of the build running in this process, innermost last (None outside one)."""
    return _current[-1] if _current else None


def scheduler_workers(client: Client) -> dict[str, dict[str, Any]]:
    """The workers the scheduler has now, by address, with their resources, asked for in one
    message. Not ``client.scheduler_info()["workers"]``: the client's poll of the scheduler,
    every 2 s, caches an identity without workers, and when its answer lands after the fresh
    one that call returns no worker at all."""
    return client.sync(client.scheduler.identity, n_workers=-1)["workers"]


def chosen(cfg: Config, dask_address: str | None = None) -> Cluster:
    """The cluster a build of ``cfg`` runs on (see the module's docstring for the order)."""
    if dask_address:
        return AddressCluster(kind="address", address=dask_address)
    if cfg.execution.cluster.kind != "local":
        return cfg.execution.cluster
    address = cfg.execution.dask_address or os.environ.get(ADDRESS_ENV)
    return AddressCluster(kind="address", address=address) if address else LocalCluster()


def api_host(cfg: Config, dask_address: str | None = None) -> str:
    """Where the build's temporary Prefect server listens: loopback, unless its workers run on
    other machines that report to it (SLURM jobs); then where the scheduler listens."""
    spec = chosen(cfg, dask_address)
    if spec.kind == "slurm":
        from flows.clusters.slurm import listen_host

        return listen_host(spec)
    return "127.0.0.1"


def check(cfg: Config, root: str, dask_address: str | None = None) -> None:
    """That the cluster can run the build, before it writes anything (SetupError): SLURM takes
    each pool's jobs."""
    spec = chosen(cfg, dask_address)
    if spec.kind == "slurm":
        from flows.clusters.slurm import check as slurm_check

        slurm_check(spec, cfg, root)


def forked_workers(cfg: Config, root: str, dask_address: str | None = None) -> ContextManager[None]:
    """The fork server a local cluster's workers come from, kept for the block; on other kinds
    none (a fork server the command line started before it knew is stopped)."""
    if chosen(cfg, dask_address).kind == "local":
        from flows.clusters.local import forked_workers as local_forked

        return local_forked(root)
    fork_server.stop()
    return nullcontext()


def forks_here(cfg: Config, dask_address: str | None = None) -> bool:
    """Whether the command line should fork the workers' fork server now: a local cluster's."""
    return chosen(cfg, dask_address).kind == "local"


@contextmanager
def workers(cfg: Config, root: str, dask_address: str | None = None,
            env: dict[str, str] | None = None) -> Iterator[Workers]:
    """The cluster a build of ``cfg`` on ``root`` runs on, up for the block. ``env``: what
    workers on other machines need of the build's environment (its Prefect server)."""
    spec = chosen(cfg, dask_address)
    _no_dashboard_claim()
    with _open(spec, cfg, root, env or {}) as found:
        _current.append(found)
        try:
            yield found
        finally:
            _current.remove(found)


@contextmanager
def _open(spec: Cluster, cfg: Config, root: str, env: dict[str, str]) -> Iterator[Workers]:
    if isinstance(spec, SlurmCluster):
        from flows.clusters.slurm import slurm_cluster

        with slurm_cluster(spec, cfg, root, env) as scaler:
            yield Workers(scaler.cluster.scheduler_address, "slurm", pools=True, gpu_pool=spec.gpu is not None,
                          status=scaler.status, failure=lambda: scaler.failure)
    elif isinstance(spec, AddressCluster):
        yield Workers(spec.address, "address")
    else:
        from flows.clusters.local import local_cluster

        with local_cluster(cfg, root) as address:
            yield Workers(address, "local", local=True)


class _NoDashboard(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "dashboard is available" not in record.getMessage()


def _no_dashboard_claim() -> None:
    """prefect-dask announces the scheduler's HTTP address as "the Dask dashboard"; the build's
    own schedulers start none (and without bokeh there is none to start)."""
    logger = logging.getLogger("prefect.task_runner.dask")
    if not any(isinstance(f, _NoDashboard) for f in logger.filters):
        logger.addFilter(_NoDashboard())
