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

Where the exception would be lost, the signal comes again a moment later instead: in a garbage
collector's callback or a finalizer (Python prints and drops it), and in a serializer that
pydantic's Python API calls (pydantic-core turns it into a PydanticSerializationError, an
Exception its callers may catch and carry on from). Should a library swallow it some other
way, or turn it into another exception, the block still ends with the signal's exception once
the work returns or fails, never as a success (tests/cli/test_stopping.py). While a Prefect
flow runs, SIGTERM goes to Prefect's own handler first, which raises its TerminationSignal and
passes the signal on here once that reaches the flow's end: one that a library loses before
then, these means do not see.
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
# The signals that came (not those this module sent again), in order; those it sends again,
# each with its timer, until they come.
_received: list[int] = []
_resends: list[tuple[int, threading.Timer]] = []


class Terminated(SystemExit):
    """SIGTERM, raised in the main thread: exits with 143 once unwound, as the signal would."""

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


_ERRORS: dict[int, type[BaseException]] = {signal.SIGTERM: Terminated, signal.SIGINT: KeyboardInterrupt}


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


def _stop(signum: int, frame: FrameType | None) -> None:
    """Raise the signal's exception in the main thread, where ``frame`` was interrupted; where
    it would be lost, the signal comes again a moment later instead (the clock started, so
    that a stop that never gets out of there still ends)."""
    resend = next((r for r in _resends if r[0] == signum), None)
    if resend is not None:
        _resends.remove(resend)
    else:
        _received.append(signum)
        _arm(signum)
    if _lost_there(frame):
        _again_soon(signum)
        return
    raise _ERRORS[signum]()


def _lost_there(frame: FrameType | None) -> bool:
    """Whether an exception raised where the main thread was interrupted would not reach the
    block: printed and dropped ("Exception ignored in ...") in a garbage collector's callback,
    such as Dask's (distributed.gc), or in a finalizer; turned into an Exception in a serializer
    that pydantic's Python API called (a Ctrl-C in Prefect's ``model_dump`` of its settings came
    out as a PydanticSerializationError). A Ctrl-C that landed there was lost, and the build ran
    on to its end."""
    callbacks = {getattr(getattr(callback, "__func__", callback), "__code__", None) for callback in gc.callbacks}
    pydantic = sys.modules.get("pydantic")
    inside = os.path.dirname(pydantic.__file__) + os.sep if pydantic is not None and pydantic.__file__ else None
    while frame is not None:
        code = frame.f_code
        if code in callbacks or code.co_name == "__del__" or (inside and code.co_filename.startswith(inside)):
            return True
        frame = frame.f_back
    return False


def _again_soon(signum: int) -> None:
    """The signal once more, a moment later, when the main thread has left the callback."""
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signum))
    timer.daemon = True
    _resends.append((signum, timer))
    timer.start()


@contextmanager
def stops_on_signals() -> Iterator[None]:
    """SIGTERM and Ctrl-C stop the block within ``GRACE_S`` (in the main thread only: elsewhere
    the process's handlers stay as they are)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {s: signal.signal(s, _stop) for s in _ERRORS}
    received = len(_received)
    try:
        yield
    except BaseException as exc:
        # Its exception swallowed on the way, or turned into another one, the block ends as
        # the signal says all the same, not as the work that went on does.
        if len(_received) > received and not isinstance(exc, tuple(_ERRORS.values())):
            raise _ERRORS[_received[-1]]() from exc
        raise
    else:
        # Swallowed for good (or not raised yet), it ends the block as the work returns.
        if len(_received) > received:
            raise _ERRORS[_received[-1]]()
    finally:
        # A clock once started keeps running: the exit that follows may hang too (a handler
        # that waits on a server that is gone). A signal that would come again is over.
        for _, timer in _resends:
            timer.cancel()
        _resends.clear()
        for s, handler in before.items():
            signal.signal(s, handler)
