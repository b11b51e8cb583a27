"""Ctrl-C and SIGTERM stop a build even when they land where Python drops exceptions: the
signal that interrupted a garbage collector's callback (Dask's distributed.gc has one) was
printed as "Exception ignored" and lost, and the build ran on to its end."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
from conftest import ROOT

# In a stops_on_signals() block, a gc callback that is running when the signal arrives.
SCRIPT = """
import gc, os, signal, sys, time
from pipeline.cli.stopping import Terminated, stops_on_signals

signum = int(sys.argv[1])
sent = []

def callback(phase, info):
    if phase == "start" and not sent:
        sent.append(1)
        os.kill(os.getpid(), signum)
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:  # the handler runs here, inside the callback
            pass

gc.callbacks.append(callback)
try:
    with stops_on_signals():
        gc.collect()
        time.sleep(5)
    print("ran on")
except (KeyboardInterrupt, Terminated) as stopped:
    print("stopped", type(stopped).__name__)
sys.stdout.flush()
os._exit(0)  # before the grace clock the signal started
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_during_a_gc_callback_still_stops_the_block(signum):
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(int(signum))], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    expected = "KeyboardInterrupt" if signum == signal.SIGINT else "Terminated"
    assert done.stdout.strip() == f"stopped {expected}", done.stdout + done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
