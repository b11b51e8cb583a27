"""Where a build's local Dask workers come from: a fork server of the build's own, which has
imported the flows and holds no model, thread or other native state.

Dask forks each worker process from the fork server. The server is never a fork of a build's
process after its checks: by then they have loaded models there (a Whisper model with
CTranslate2's thread pool, torch with CUDA, a gRPC channel), and native state does not survive a
fork. A forked worker inherited the Whisper model without its pool's threads and hung in its
first transcription; CUDA refuses a process forked after it started. So the server is one of:

- a fork of the command line (``vlcorpus build``, ``vlcorpus demo``) taken before its checks,
  once it has imported the flows, which it needs itself: modules only, no model, no thread
  (``start(from_here=True)``). A new interpreter importing them again cost about 2 CPU-s a build.
- elsewhere (a deployment's flow run, a build called from Python, whose process may hold models
  already), a new interpreter that imports only what ``flows.worker_start`` does.

tests/flows/test_fork_server.py forks the server as the command line does, loads every library
the checks load, then uses each in a worker; and checks that a new interpreter's server holds no
thread and no model. The server imports the flows once, where spawned workers would import them
once each (1.5 to 2 CPU-s each).

The fork server has the environment of the build's process when it starts (the workers get the
build's environment of the moment from their nanny), and its standard error is relayed to the
build's (the log file); it stops with the build, so that the next build in the same process gets
one of its own.
"""

from __future__ import annotations

import importlib
import inspect
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import connection, forkserver, resource_tracker

from pipeline.gc_pause import collector_paused

# The module whose import readies a worker process (a Dask preload).
WORKER_START = "flows.worker_start"

# A fork server forked from this process is set in the standard library's private state of a
# running one, whose layout is that of Pythons 3.11 to 3.13 (3.14 adds an authentication key):
# elsewhere the server is a new interpreter.
_CAN_FORK_HERE = list(inspect.signature(forkserver.main).parameters) == [
    "listener_fd", "alive_r", "preload", "main_path", "sys_path"]

_depth = [0]
_running = [False]


def start(*, from_here: bool = False) -> None:
    """Start the fork server now if it is not running: the command line starts it as soon as
    the config holds. ``from_here``: fork it from this process once it has imported the flows,
    for a caller that has loaded no model yet (the command line before its checks), and where
    no other thread runs (one holding a lock would leave it held in the fork); else it is a new
    interpreter, whose import of the flows overlaps the caller's work."""
    if _running[0]:
        return
    forkserver.set_forkserver_preload([WORKER_START])
    fork = from_here and _CAN_FORK_HERE
    if fork:
        # What the workers import, by name: this module is the workers' start, below the flows
        # it starts them for (the command line runs them later).
        with collector_paused():
            importlib.import_module(WORKER_START)
        fork = threading.active_count() == 1
    # Its standard error (and so its workers') is a pipe that this process copies to its own
    # standard error, whatever that is by then: the build's log file, opened after the checks.
    read, write = os.pipe()
    if fork:
        _fork_here(read, write)
    else:
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


def _fork_here(relay: int, stderr: int) -> None:
    """The fork server as a fork of this process with standard error ``stderr``, set up as
    ``forkserver.ensure_running`` sets up a new interpreter: a listening socket, and a pipe
    whose write ends close when this process and every worker have gone. It imports the rest
    of ``flows.worker_start`` itself."""
    resource_tracker.ensure_running()
    # Nothing this process has buffered may be written again by a worker as it exits.
    sys.stdout.flush()
    sys.stderr.flush()
    address = connection.arbitrary_address("AF_UNIX")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(alive_w)
                os.close(relay)
                os.dup2(stderr, 2)
                os.close(stderr)
                # A new interpreter's handlers, which the workers inherit: the command line's
                # would stop a build.
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                forkserver.main(listener.fileno(), alive_r, [WORKER_START])
            except Exception:  # to the build's log, as a new interpreter's traceback would go
                traceback.print_exc()
                code = 1
            finally:
                # Never this process's exit handlers (its temporary server's stop among them).
                os._exit(code)
    os.close(alive_r)
    os.close(stderr)
    server = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid


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
