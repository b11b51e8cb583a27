"""An automation of the server's, by name: updated in place when it is there, created when not.

Deleting an automation and creating it again, as registering anew would, gives it a new id, and
the server's triggers evaluate the events that come meanwhile with the automations they hold
cached: one deleted fails each such event (PostgreSQL refuses its bucket: a foreign key), and
when one automation of an event fails the server evaluates the event again for all of them, then
gives it up (flows/once.py), with the run's later events, which wait for it. A run that crashed
just after a `vlcorpus deploy` was neither rerun nor alerted. Updated in place, it keeps its id.
"""

from __future__ import annotations

from prefect.automations import Automation
from prefect.client.orchestration import get_client


def put(automation: Automation) -> Automation:
    """``automation`` on the server under its name, the one there updated in place (any other of
    that name deleted); returns it as the server keeps it."""
    with get_client(sync_client=True) as client:
        there = client.read_automations_by_name(name=automation.name)
        for extra in there[1:]:
            client.delete_automation(extra.id)
    if not there:
        return automation.create()
    automation.id = there[0].id
    automation.update()
    return Automation.read(id=automation.id)
