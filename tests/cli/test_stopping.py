"""Ctrl-C and SIGTERM stop a build even when they land where their exception is lost: the
signal that interrupted a garbage collector's callback (Dask's distributed.gc has one) or a
finalizer was printed as "Exception ignored" and lost, and the build ran on to its end; one
that interrupted a pydantic serializer (Prefect's settings and payloads) came out as a
PydanticSerializationError, an Exception that the caller may catch and carry on from, and the
build ended with exit 0 or 1. Should a library swallow it some other way, the block still ends
as the signal says once the work returns."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from conftest import ROOT

# In a stops_on_signals() block, the signal arrives while a gc callback, a __del__ or a pydantic
# serializer runs (its caller catching what comes out, as a library might; last: the block then
# ends before the signal comes again), or inside code that catches every exception and carries
# on (then fails: another exception leaves the block).
SCRIPT = """
import gc, os, sys, time
from pydantic import BaseModel, model_serializer
from pipeline.cli.stopping import Terminated, stops_on_signals

signum, where = int(sys.argv[1]), sys.argv[2]
sent = []

def interrupted_here():
    if not sent:
        sent.append(1)
        os.kill(os.getpid(), signum)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # the handler runs here
            pass

class Finalized:
    def __del__(self):
        interrupted_here()

class Serialized(BaseModel):
    @model_serializer(mode="wrap")
    def _dump(self, handler):
        interrupted_here()
        return handler(self)

if where == "gc_callback":
    gc.callbacks.append(lambda phase, info: phase == "start" and interrupted_here())
try:
    with stops_on_signals():
        if where == "gc_callback":
            gc.collect()
        elif where == "finalizer":
            Finalized()
        else:
            try:
                Serialized().model_dump() if where.startswith("pydantic") else interrupted_here()
            except BaseException:
                pass
        if where == "swallowed_then_failed":
            raise RuntimeError("the work failed")
        if where != "pydantic_serializer_last":
            time.sleep(2)  # the signal that came again arrives here
        print("ran on")
except (KeyboardInterrupt, Terminated) as stopped:
    print("stopped", type(stopped).__name__)
sys.stdout.flush()
os._exit(0)  # before the grace clock the signal started
"""


@pytest.mark.parametrize("where", ["gc_callback", "finalizer", "pydantic_serializer", "pydantic_serializer_last",
                                   "swallowed", "swallowed_then_failed"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_where_its_exception_would_be_lost_still_stops_the_block(signum, where):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(int(signum)), where], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    expected = "KeyboardInterrupt" if signum == signal.SIGINT else "Terminated"
    # Swallowed for good, or the block done before it came again, it ends the block as the work
    # returns.
    ran_on = "ran on\n" if where in ("swallowed", "pydantic_serializer_last") else ""
    assert done.stdout == f"{ran_on}stopped {expected}\n", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr


# The signal lands in a pydantic serializer that does not return: each time it comes again it
# lands there again, and the grace clock it started ends the process.
NEVER_OUT = """
import os, signal, sys, time
from pydantic import BaseModel, model_serializer
from pipeline.cli import stopping

stopping.GRACE_S = 1.0

class Endless(BaseModel):
    @model_serializer(mode="wrap")
    def _dump(self, handler):
        os.kill(os.getpid(), signal.SIGINT)
        while True:
            pass

with stopping.stops_on_signals():
    Endless().model_dump()
"""


def test_a_signal_that_can_never_be_raised_still_ends_the_process_after_the_grace():
    done = subprocess.run([sys.executable, "-c", NEVER_OUT], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.returncode == 128 + signal.SIGINT, done.stdout + done.stderr
    assert "still stopping after 1 s: exiting now" in done.stderr, done.stderr
