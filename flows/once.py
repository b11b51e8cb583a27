"""Automations that act once per flow run, however often the server evaluates its event.

Prefect's server evaluates each automation that an event concerns in a transaction of its own,
and when one of them fails (SQLite's "database is locked" on a busy machine) the event is
evaluated again by all of them: an automation that had acted acts again. Under a busy SQLite,
one crash was seen to schedule two and four reruns. A reactive trigger keyed on the event's run
(``for_each`` its id) that keeps a window after it acts (``within``) takes the event, evaluated
again, for one it has acted on, and a second event of its kind for that run within the window
too (a run marked Crashed twice, by its worker and by the server). The server forgets a run's
window once it has passed: a row per run, kept for two windows.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

# Far longer than the server takes to evaluate an event again (seconds), or than a run takes
# to be marked Crashed twice.
ONCE_WITHIN = timedelta(hours=1)
# A reactive trigger's keywords that make it act once per flow run.
ONCE_PER_RUN: dict[str, Any] = {"for_each": {"prefect.resource.id"}, "within": ONCE_WITHIN}
