"""Where a build's local Dask workers come from: a fork server of the build's own, always a new
interpreter.

Dask forks each worker process from the fork server. The server is never a fork of the build's
process: by the time a build starts its workers, its checks have loaded models there (a Whisper
model with CTranslate2's thread pool, torch with CUDA, a gRPC channel), and native state does not
survive a fork. A forked worker inherited the Whisper model without its pool's threads and hung in
its first transcription; CUDA refuses a process forked after it started. A new interpreter holds
only what ``flows.worker_start`` imports (modules, no model, no thread: tests/flows/test_fork_server.py
checks), so what any library a check loads does stays in the build's process. The server imports
the flows once, where spawned workers would import them once each (1.5 to 2 CPU-s each).

The fork server has the environment of the build's process when it starts (the workers get the
build's environment of the moment from their nanny), and its standard error is relayed to the
build's (the log file); it stops with the build, so that the next build in the same process gets
one of its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import forkserver

from pipeline.config import Config

# The module whose import readies a worker process (a Dask preload).
WORKER_START = "flows.worker_start"

_depth = [0]
_running = [False]


def start() -> None:
    """Start the fork server now if it is not running: the command line starts it as soon as
    the config holds, so that its import of the flows overlaps the build's checks and its own
    imports."""
    if _running[0]:
        return
    forkserver.set_forkserver_preload([WORKER_START])
    # Its standard error (and so its workers') is a pipe that this process copies to its own
    # standard error, whatever that is by then: the build's log file, opened after the checks.
    read, write = os.pipe()
    saved = os.dup(2)
    os.dup2(write, 2)
    try:
        forkserver.ensure_running()
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write)
    threading.Thread(target=_relay, args=(read,), name="workers' stderr", daemon=True).start()
    _running[0] = True


def stop() -> None:
    """Stop the fork server (its workers are gone by now, or see it go)."""
    if _running[0] and not _depth[0]:
        # The standard library has no public stop; this is the one its own tests use.
        forkserver._forkserver._stop()
        _running[0] = False


def _relay(read: int) -> None:
    with os.fdopen(read, "rb", buffering=0) as pipe:
        for chunk in iter(lambda: pipe.read(1 << 16), b""):
            os.write(2, chunk)


@contextmanager
def fork_server() -> Iterator[None]:
    """A fork server running until the outermost of these blocks ends, and Dask set to start
    worker processes from it."""
    import dask

    start()
    _depth[0] += 1
    try:
        with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
            yield
    finally:
        _depth[0] -= 1
        stop()


def cluster_address(cfg: Config, dask_address: str | None = None) -> str | None:
    """The Dask cluster a build should use: given, in the config, or the workers' environment
    (which lets a deployment's workers point every build at their cluster)."""
    return dask_address or cfg.execution.dask_address or os.environ.get("VLCORPUS_DASK_ADDRESS")


@contextmanager
def local_workers(cfg: Config, root: str, dask_address: str | None = None) -> Iterator[None]:
    """The fork server of a local cluster's worker processes, when the build will start one
    (none on a given cluster, or for an in-memory root, whose workers are threads)."""
    if cluster_address(cfg, dask_address) is None and not root.startswith("memory://"):
        with fork_server():
            yield
    else:
        stop()  # one the command line started before it knew
        yield
