"""Where a build's local Dask workers come from: a fork server of the build's own.

Dask forks each worker process from the fork server, which is single-threaded, so no lock a
worker needs can be held by another thread at that moment (forking the build's own process,
whose threads print and log, once left a worker deadlocked on a console's lock). When the
build's process runs no other Python thread and has imported the flows, the fork server is a
fork of it: the workers start with everything imported, in a tenth of a second. Otherwise
(a test's process, a Prefect flow run's, with threads of their own) the fork server is a new
interpreter that imports the flows once (``flows.worker_start``), where spawned workers would
import them once each (1.5 to 2 CPU-s each, on the cores the temporary server's start needs).

The fork server has the environment and standard error of the build's process when it starts
(the build's log file); it stops with the build, so that the next build in the same process
gets one of its own.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from multiprocessing import forkserver, util

# The module whose import readies a worker process (a Dask preload).
WORKER_START = "flows.worker_start"

_depth = [0]


@contextmanager
def fork_server() -> Iterator[None]:
    """A fork server running until the outermost of these blocks ends, and Dask set to start
    worker processes from it."""
    import dask

    if _depth[0] == 0:
        _start()
    _depth[0] += 1
    try:
        with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}):
            yield
    finally:
        _depth[0] -= 1
        if _depth[0] == 0:
            # The standard library has no public stop; this is the one its own tests use.
            forkserver._forkserver._stop()


def _start() -> None:
    forkserver.set_forkserver_preload([WORKER_START])
    if not _single_threaded():
        forkserver.ensure_running()
        return
    spawn = util.spawnv_passfds
    util.spawnv_passfds = _fork_instead
    try:
        forkserver.ensure_running()
    finally:
        util.spawnv_passfds = spawn


def _single_threaded() -> bool:
    """Whether no Python thread but this one runs, on a platform that forks safely. Native
    pools (OpenBLAS's, jemalloc's in Arrow) hold no Python lock and see to forks themselves."""
    return sys.platform == "linux" and threading.active_count() == 1


def _fork_instead(path: str, args: Sequence[str], passfds: Sequence[int]) -> int:
    """``multiprocessing.util.spawnv_passfds`` for the fork server (and the resource tracker it
    starts first): instead of a new interpreter running the server's code (``-c``), a fork of
    this process runs it, with the modules to preload there already."""
    code = args[list(args).index("-c") + 1]
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        try:
            _as_if_exec(passfds)
            exec(code, {"__name__": "__forkserver__"})
        finally:
            # Never this process's exit handlers: they belong to the build (its server's stop).
            os._exit(0)
    return pid


def _as_if_exec(passfds: Sequence[int]) -> None:
    """The descriptors a new interpreter would not have had (those not inheritable and not
    passed: the other ends of the server's pipes among them, which must close for it to see
    its parent go) now read /dev/null. They stay taken, so that an object of the parent's that
    closes one later cannot close a descriptor opened since under the same number."""
    null = os.open(os.devnull, os.O_RDWR)
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd > 2 and fd != null and fd not in passfds:
            try:
                if not os.get_inheritable(fd):
                    os.dup2(null, fd, inheritable=False)
            except OSError:  # the listing's own descriptor, closed by now
                continue
    os.close(null)
