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
import gc
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


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    _stop(signum, frame, Terminated)


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _stop(signum, frame, KeyboardInterrupt)


def _stop(signum: int, frame: FrameType | None, error: type[BaseException]) -> None:
    """Raise ``error`` in the main thread, where ``frame`` was interrupted; where Python would
    drop it, the signal comes again a moment later instead."""
    if _dropped_there(frame):
        _again_soon(signum)
        return
    _arm(signum)
    raise error()


def _dropped_there(frame: FrameType | None) -> bool:
    """Whether an exception raised where the main thread was interrupted would be printed and
    dropped ("Exception ignored in ..."): in a garbage collector's callback, such as Dask's
    (distributed.gc), or in a finalizer. A Ctrl-C that landed there was lost, and the build ran
    on to its end."""
    callbacks = {getattr(getattr(callback, "__func__", callback), "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int) -> None:
    """The signal once more, a moment later, when the main thread has left the callback."""
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


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
