"""How a command that builds stops on SIGTERM (`timeout`, a scheduler, `kill`) or Ctrl-C: soon,
and cleanly where it can.

The signal is raised in the main thread as ``Terminated`` (SIGTERM) or ``KeyboardInterrupt``
(Ctrl-C), so the build unwinds: its Prefect flow run ends Crashed (Prefect's own handler during
the run, which passes the signal on here), the Dask cluster and the temporary server stop, the
root lock is released. Unwinding waits on things that may not end (a worker stuck in native
code, a server that went away), so the first signal also starts a clock: after ``GRACE_S``,
every thread's stack goes to standard error and the process exits at once, as does a second
signal. The processes it started see it go (tests/flows/test_startup.py), and a lock left by a
dead process on this host is taken over by the next build at once.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# Seconds from the first signal to the hard exit: the 30 s a user (or `timeout -k 30`) allows,
# less a margin.
GRACE_S = 20.0

_armed: list[threading.Timer] = []


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread: exits with 143 once unwound, as the signal would."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


def _arm(signum: int) -> None:
    """The first signal starts the grace clock; another one ends the process now."""
    if _armed:
        _exit_now(signum, "a second signal")
    timer = threading.Timer(GRACE_S, _exit_now, (signum, f"still stopping after {GRACE_S:.0f} s"))
    timer.daemon = True
    _armed.append(timer)
    timer.start()


def _exit_now(signum: int, why: str) -> None:
    sys.stderr.write(f"vlcorpus: {why}: exiting now; every thread's stack:\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(all_threads=True)
    os._exit(128 + signum)


def _on_sigterm(signum: int, _frame: FrameType | None) -> None:
    _arm(signum)
    raise Terminated()


def _on_sigint(signum: int, _frame: FrameType | None) -> None:
    _arm(signum)
    raise KeyboardInterrupt


@contextmanager
def stops_on_signals() -> Iterator[None]:
    """SIGTERM and Ctrl-C stop the block within ``GRACE_S`` (in the main thread only: elsewhere
    the process's handlers stay as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, h) for s, h in ((signal.SIGTERM, _on_sigterm), (signal.SIGINT, _on_sigint))}
    try:
        yield
    finally:
        # A clock once started keeps running: the exit that follows may hang too (a handler
        # that waits on a server that is gone).
        for s, handler in before.items():
            signal.signal(s, handler)
