"""A batch that makes no progress for ``execution.stall_s`` is a stall, not a wait.

A native library that deadlocks (a model whose thread pool did not survive a fork, a driver, a
gRPC channel) blocks its thread in C, where no exception reaches it: the batch runs in a thread of
its own, and the runner's thread watches the batch's last sign of progress. The stage's code gives
one with ``progress.beat()`` (per item, per ASR segment, per download progress report;
``progress.carried`` lends the batch's clock to a pool's threads). After ``stall_s``
without one, every thread's stack goes to the log and ``Stalled`` is raised in the runner's
thread; the stuck thread is left behind (nothing can stop it), a daemon that dies with its process.
"""

from __future__ import annotations

import contextvars
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import TypeVar

from pipeline.errors import StageStopped
from pipeline.progress import batch_clock, log

T = TypeVar("T")

# How often the watching thread looks at the clock: a stall is seen within this of stall_s.
_LOOK_S = 1.0

STALL_PREFIX = "stalled"


class Stalled(StageStopped):
    """A batch made no progress for ``stall_s``: its items failed as ``internal`` (never a
    verdict), and the stage stops for this run."""


def stalled(stopped: str | None) -> bool:
    """Whether a stage's ``stopped`` message says a batch stalled."""
    return bool(stopped) and stopped.startswith(STALL_PREFIX)


def run_watched(fn: Callable[[], T], stall_s: float | None, where: str) -> T:
    """``fn()`` in a thread of its own, returning its result or raising its exception; raises
    ``Stalled`` once it has gone ``stall_s`` seconds without a ``beat()``. None: no watch."""
    if not stall_s:
        return fn()
    clock = [time.monotonic()]
    result: list[T] = []
    failure: list[BaseException] = []

    def target() -> None:
        batch_clock.set(clock)
        try:
            result.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the watching thread
            failure.append(exc)

    # The batch sees this thread's context (Prefect's run, the limits' backend).
    thread = threading.Thread(target=contextvars.copy_context().run, args=(target,),
                              name=f"batch {where}", daemon=True)
    thread.start()
    while True:
        thread.join(_LOOK_S)
        if not thread.is_alive():
            break
        quiet = time.monotonic() - clock[0]
        if quiet >= stall_s:
            log.error("%s: no progress for %.0f s; every thread's stack:\n%s", where, quiet, stacks())
            raise Stalled(f"{STALL_PREFIX}: {where} made no progress for {quiet:.0f} s "
                          f"(execution.stall_s; its stacks are in the log)")
    if failure:
        raise failure[0]
    return result[0]


def stacks() -> str:
    """Every Python thread's stack in this process, as text."""
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"Thread {names.get(ident, ident)!r}:\n{''.join(traceback.format_stack(frame))}")
    return "\n".join(parts)
