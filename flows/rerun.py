"""A deployment's Crashed run is run again exactly once, after a short delay.

The rerun is a deployment trigger: an automation that Prefect ties to the deployment (replaced
each time it is registered). When a run of the deployment ends Crashed (its heartbeats stopped
or it never left Pending, flows/liveness.py, or its worker saw its process die), the trigger
runs the deployment again ``after_s`` later with the crashed run's parameters and ``rerun_of``
set to the crashed run's id. The rerun renames itself ``<name>-rerun`` before it builds, and
the trigger skips runs so named: a rerun that crashes too is not run again, its Crashed state
alerts and the next scheduled run builds. It resumes the committed batches of the crashed
build, and the root's lock keeps it from building beside any other build of the root.

Prefect's triggers act at least once (flows/once.py): the trigger acts once per crashed run
however often the server evaluates its Crashed event, and should it schedule a second rerun all
the same, the reruns claim the crash on the server before they build (flows/siblings.py
``repeated``): the first to claim it builds, any other ends Cancelled without building.
"""

from __future__ import annotations

from datetime import timedelta
from uuid import UUID

from prefect import Flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.objects import FlowRun
from prefect.events.schemas.automations import Posture
from prefect.events.schemas.deployment_triggers import DeploymentEventTrigger

from flows.once import ONCE_PER_RUN

SUFFIX = "-rerun"
PARAMETER = "rerun_of"


def rerun_trigger(deployment: str, flow: Flow, after_s: int) -> DeploymentEventTrigger:
    """The trigger that reruns ``deployment`` (of ``flow``, which takes ``rerun_of``) ``after_s``
    seconds after one of its runs, other than a rerun, ends Crashed."""
    # The crashed run's own values; one it was not given takes the flow's default (Python's
    # literals are Jinja's too).
    parameters = {name: _json(f"{{{{ flow_run.parameters.get({name!r}, {schema.get('default')!r}) | tojson }}}}")
                  for name, schema in flow.parameters.properties.items() if name != PARAMETER}
    parameters[PARAMETER] = {"__prefect_kind": "jinja", "template": "{{ flow_run.id }}"}
    return DeploymentEventTrigger(
        name=f"vlcorpus-rerun-crashed {deployment}",
        description=f"Run {deployment} again once, {after_s} s after one of its runs ends Crashed.",
        expect={"prefect.flow-run.Crashed"},
        match={"prefect.resource.id": "prefect.flow-run.*", "prefect.resource.name": f"!*{SUFFIX}"},
        match_related=[{"prefect.resource.role": "flow", "prefect.resource.name": flow.name},
                       {"prefect.resource.role": "deployment", "prefect.resource.name": deployment}],
        posture=Posture.Reactive, threshold=1, **ONCE_PER_RUN,
        parameters=parameters, schedule_after=timedelta(seconds=after_s))


def _json(template: str) -> dict[str, object]:
    """A run-deployment parameter rendered from the triggering run, keeping its JSON type."""
    return {"__prefect_kind": "json", "value": {"__prefect_kind": "jinja", "template": template}}


def name_rerun(run: FlowRun, crashed: UUID) -> FlowRun:
    """Rename ``run`` (on the server, and the object its flow's logs and lock read) as the
    rerun of the run ``crashed``; returns the crashed run, as read now."""
    with get_client(sync_client=True) as client:
        then = client.read_flow_run(crashed)
        client.set_flow_run_name(run.id, f"{then.name}{SUFFIX}")
    run.name = f"{then.name}{SUFFIX}"
    return then
