"""Ctrl-C and SIGTERM stop a build even when they land where Python drops exceptions: the
signal that interrupted a garbage collector's callback (Dask's distributed.gc has one) or a
finalizer was printed as "Exception ignored" and lost, and the build ran on to its end."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from conftest import ROOT

# In a stops_on_signals() block, the signal arrives while a gc callback or a __del__ runs.
SCRIPT = """
import gc, os, sys, time
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

gc.callbacks.append(lambda phase, info: phase == "start" and interrupted_here())
try:
    with stops_on_signals():
        if where == "gc_callback":
            gc.collect()
        else:
            Finalized()
        time.sleep(5)
    print("ran on")
except (KeyboardInterrupt, Terminated) as stopped:
    print("stopped", type(stopped).__name__)
sys.stdout.flush()
os._exit(0)  # before the grace clock the signal started
"""


@pytest.mark.parametrize("where", ["gc_callback", "finalizer"])
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_where_python_drops_exceptions_still_stops_the_block(signum, where):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(int(signum)), where], capture_output=True,
                          text=True, cwd=ROOT, timeout=60)
    expected = "KeyboardInterrupt" if signum == signal.SIGINT else "Terminated"
    assert done.stdout.strip() == f"stopped {expected}", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
