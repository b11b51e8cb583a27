"""A deployment's run whose process died is marked Crashed by the server within minutes.

A process killed with its machine reports nothing, so its run would stay Running until the next
run of its root took the lock over, a day later for a nightly build. Instead each run's process
sends Prefect's flow-run heartbeats (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``, put in the
deployments' job variables so that no worker needs the variable), and one automation per server
marks a run Crashed when its heartbeats stop: Prefect's answer to "zombie" flow runs. Prefect's
own watch starts at a run's first heartbeat, so a process that died between entering Running
and sending one would never be marked; the automation also watches the runs of the deployments
registered here (which carry TAG, and send heartbeats) from their Running state. And a run that
died before it ran sends no heartbeat and never enters Running: a deployment's run whose worker
took it (Pending) and died before it started its process, or a subflow run (which carries no
tag) created Pending in a build's process that died before it ran it. The automation watches
those from Pending, which a live run leaves within seconds, and marks one Crashed that sent
neither a Running state nor a heartbeat within the same window. The Crashed state then fires
the alert of infra/alerts.py, and a deployment's rerun (flows/rerun.py) where it has one.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

from prefect.automations import Automation
from prefect.client.schemas.objects import State, StateType
from prefect.events.actions import ChangeFlowRunState
from prefect.events.schemas.automations import CompoundTrigger, EventTrigger, Posture
from pydantic import BaseModel, ConfigDict, Field, model_validator

from flows.automations import put

NAME = "vlcorpus-crashed-when-silent"
HEARTBEAT_ENV = "PREFECT_FLOWS_HEARTBEAT_FREQUENCY"
# The tag of the deployments whose runs send heartbeats, watched from their start: a run of
# another deployment of the same flows (one served, or registered before this tag) may send
# none, and must not be taken for dead.
TAG = "vlcorpus-heartbeats"
# How the state that this automation sets begins (flows/revive.py looks for it).
SILENT = "Crashed: its process sent no heartbeat for"
# Prefect sends heartbeats no more often than this (prefect.flow_engine.MINIMUM_HEARTBEAT_INTERVAL).
MIN_HEARTBEAT_S = 30
# Any of these ends a run's watch: a heartbeat starts the next wait, a final state ends it.
# Failed and Crashed do not: the alert (infra/alerts.py) and the rerun (flows/rerun.py) act on
# those, and when one automation of an event fails the server evaluates the event again for all
# of them, up to four times, then drops it. A watch fails on a busy SQLite (it reads its record
# before it writes it, and another commit can land between: "database is locked"); the alert's
# and the rerun's triggers write first, and so wait for the lock instead. A watch that a Failed
# or Crashed run leaves open fires once, and the server refuses to mark a finished run Crashed
# ("Run is already in terminal state": a warning in its log).
_ALIVE_OR_ENDED = {"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Cancelled"}
# And a Pending run's: Running starts the watch from Running where its run has one.
_STARTED = {*_ALIVE_OR_ENDED, "prefect.flow-run.Running"}


class Liveness(BaseModel):
    """How often a run's process says it is alive, and how long a silence means it died."""

    model_config = ConfigDict(extra="forbid")

    heartbeat_s: int = Field(MIN_HEARTBEAT_S, ge=MIN_HEARTBEAT_S)
    # Three heartbeats: a run under load that sends one late is not taken for dead.
    crashed_after_s: int = 90

    @model_validator(mode="after")
    def _two_heartbeats(self) -> Liveness:
        if self.crashed_after_s < 2 * self.heartbeat_s:
            raise ValueError(f"crashed_after_s ({self.crashed_after_s}) must be at least twice heartbeat_s "
                             f"({self.heartbeat_s}): one late heartbeat is not a dead run")
        return self

    def job_env(self) -> dict[str, str]:
        """The flow-run process's environment that makes it send heartbeats."""
        return {HEARTBEAT_ENV: str(self.heartbeat_s)}

    def message(self) -> str:
        return (f"{SILENT} {self.crashed_after_s} s (the process or its "
                f"machine died, or its worker died before starting it); its committed batches are kept "
                f"and the next run of the root resumes them")


def silenced(state: State | None) -> bool:
    """Whether ``state`` is the Crashed this automation sets: no heartbeat for the window. A live
    run whose heartbeats a busy server lost is so marked too, and goes back to Running
    (flows/revive.py)."""
    return state is not None and state.is_crashed() and (state.message or "").startswith(SILENT)


def _silent_after(event: str, related: list[dict[str, str | list[str]]], liveness: Liveness,
                  expect: set[str] = _ALIVE_OR_ENDED) -> EventTrigger:
    """Fires for a flow run (matching ``related``) that sent none of ``expect`` (a heartbeat,
    a final state) within ``crashed_after_s`` of its ``event``."""
    return EventTrigger(
        after={event}, expect=expect,
        match={"prefect.resource.id": "prefect.flow-run.*"}, match_related=related,
        for_each={"prefect.resource.id"},
        posture=Posture.Proactive, threshold=1, within=timedelta(seconds=liveness.crashed_after_s))


def install(liveness: Liveness, flows: Iterable[str]) -> Automation:
    """Create (or replace) the server's automation that marks a run of ``flows`` (these flow
    names: a build's subflow runs send heartbeats too) Crashed once its heartbeats stop, a run
    of a deployment tagged TAG that sent none since it entered Running, and a run of one of
    them, or a subflow run, that never left Pending."""
    of_flows = {"prefect.resource.role": "flow", "prefect.resource.name": sorted(flows)}
    tagged = {"prefect.resource.id": f"prefect.tag.{TAG}"}
    # A subflow run's events name the task run that stands for it in its parent's run.
    subflow = {"prefect.resource.role": "task-run"}
    automation = Automation(
        name=NAME,
        description=f"A vlcorpus run sent no heartbeat, or stayed Pending, for {liveness.crashed_after_s} s: "
                    f"mark it Crashed.",
        trigger=CompoundTrigger(require="any", triggers=[
            _silent_after("prefect.flow-run.heartbeat", [of_flows], liveness),
            _silent_after("prefect.flow-run.Running", [of_flows, tagged], liveness),
            _silent_after("prefect.flow-run.Pending", [of_flows, tagged], liveness, expect=_STARTED),
            _silent_after("prefect.flow-run.Pending", [of_flows, subflow], liveness, expect=_STARTED),
        ]),
        actions=[ChangeFlowRunState(state=StateType.CRASHED, message=liveness.message())],
    )
    return put(automation)
