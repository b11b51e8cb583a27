"""A Dask worker that has begun to close exits within ``GRACE_S``, whatever its close waits for.

A SLURM job's worker closes on the job's SIGTERM (its end, a preemption, the build cancelling
it). Its close can wait for ever: a worker whose tasks held Prefect concurrency slots kept its
event loop waiting on their lease threads, and lived on after its job (the node's slurmd kills
it only after KillWait, and not at all if slurmd is gone). A GPU held that way is GPU time
without work. The worker's start (flows.worker_start, flows.gpu_worker_start) watches it.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

GRACE_S = 20.0


def exit_if_closing_hangs(worker: Any) -> None:
    """Watch ``worker`` from a thread of its own: once it has been closing ``GRACE_S``, the
    process exits."""
    from distributed.core import Status

    closing = {Status.closing, Status.closed, Status.failed}

    def watch() -> None:
        since = None
        while True:
            time.sleep(1)
            since = (since or time.monotonic()) if worker.status in closing else None
            if since is not None and time.monotonic() - since > GRACE_S:
                sys.stderr.write(f"vlcorpus: worker {worker.name} still closing after {GRACE_S:.0f} s: exiting\n")
                sys.stderr.flush()
                os._exit(0)

    threading.Thread(target=watch, name="vlcorpus-exit-watch", daemon=True).start()
