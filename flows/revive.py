"""A live run that the server marked Crashed for its silence goes back to Running.

The server marks a run Crashed once it has had no heartbeat of it for ``crashed_after_s``
(flows/liveness.py). A server too busy to take heartbeats in loses some of a live run's: on a
busy SQLite, Prefect gives an event up after five refused tries (infra/README.md). In the suite
two heartbeats in a row of a run waiting for its root's lock were given up, and the live build
was marked Crashed. Its own Completed replaces that state when it ends (the server takes
Completed after Crashed), but until then the run shows a final state: whatever waits for its
end takes the Crash for it (the suite's wait did), and its rerun, due a minute after the Crash,
would build the root again. So while a deployment's run builds, it reads its own state every
CHECK_S, and once more as it ends: marked Crashed by the liveness automation, it sets itself,
and any of its subflow runs so marked (they send heartbeats too), Running again and says so in
its log. The Crashed state's alert has posted by then; a rerun scheduled meanwhile finds the run
alive and ends Cancelled without building (``flows.siblings.repeated``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.states import Running

from flows.liveness import silenced
from flows.siblings import run_tree

# Well within a liveness window: the rerun of a deployment comes 60 s after the Crash.
CHECK_S = 15.0


@contextmanager
def revived(run_id: UUID, logger: logging.LoggerAdapter | logging.Logger) -> Iterator[None]:
    """Within the block, the run ``run_id`` goes back to Running whenever it finds itself marked
    Crashed for silence, within CHECK_S, and a last time when the block ends well (one that
    raises ends the run Failed or Crashed anyway)."""
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(CHECK_S):
            revive(run_id, logger)

    thread = threading.Thread(target=watch, name="vlcorpus-revive", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
    thread.join()
    revive(run_id, logger)


def revive(run_id: UUID, logger: logging.LoggerAdapter | logging.Logger) -> list[str]:
    """Set the live run ``run_id``, and each of its subflow runs (they send heartbeats too), Running
    again where the liveness automation marked it Crashed; the names of those it set."""
    try:
        with get_client(sync_client=True) as client:
            marked = [run for run in run_tree(client, run_id) if silenced(run.state)]
            for run in marked:
                client.set_flow_run_state(run.id, Running(message="alive: the server had marked it Crashed for "
                                                                  "lost heartbeats"), force=True)
    except Exception as exc:  # noqa: BLE001 - a busy server: the next look tries again
        logger.warning("could not read or mend this run's state: %s", exc)
        return []
    for run in marked:
        logger.warning("the server marked %s Crashed while it ran (%s); its heartbeats were lost on the way, and "
                       "it is Running again", "this run" if run.id == run_id else f"its subflow run {run.name!r}",
                       run.state.message)
    return [run.name for run in marked]
