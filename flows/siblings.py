"""What a deployment's run settles with the runs around it, before it builds: a scheduled run
missed while no worker was up steps aside for the newest one due, a second rerun of one crashed
run steps aside for the one that claimed the crash first, and a run that died holding the corpus
root is marked Crashed by whoever takes the root over."""

from __future__ import annotations

from contextlib import suppress
from datetime import datetime, timedelta, timezone
from uuid import UUID

from prefect.client.orchestration import SyncPrefectClient, get_client
from prefect.client.schemas.actions import VariableCreate
from prefect.client.schemas.filters import (
    FlowRunFilter,
    FlowRunFilterDeploymentId,
    FlowRunFilterExpectedStartTime,
    FlowRunFilterParentFlowRunId,
)
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
from prefect.states import Crashed

from pipeline.corpus.rootlock import Holder

_CANCELLED = "CANCELLED"
# A rerun's claim on a crash: a Prefect variable named after the crashed run.
CLAIM = "vlcorpus-rerun"
# A claim outlives any rerun of its crash that could still start: as long as the server keeps
# the runs themselves (infra/README.md's retention, 30 days), then it is deleted.
CLAIM_KEPT = timedelta(days=30)


def _due(run: FlowRun, after: datetime, before: datetime, limit: int) -> list[FlowRun]:
    """The runs of ``run``'s deployment due between ``after`` and ``before``, latest first."""
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[run.deployment_id]),
                expected_start_time=FlowRunFilterExpectedStartTime(after_=after, before_=before)),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=limit)


def superseded(run: FlowRun) -> str | None:
    """Why a scheduled ``run`` should not build: a later scheduled run of its deployment is due
    too (runs queued while no worker was up); None when it is the newest due, or not scheduled.
    Ad-hoc runs always build."""
    if not run.auto_scheduled or run.deployment_id is None or run.expected_start_time is None:
        return None
    later = _due(run, run.expected_start_time, datetime.now(timezone.utc), limit=50)
    newer = [other for other in later if other.id != run.id and other.auto_scheduled
             and other.expected_start_time > run.expected_start_time
             and (other.state is None or other.state.type.value != _CANCELLED)]
    if not newer:
        return None
    newest = newer[0]
    return (f"superseded: this run was due at {run.expected_start_time:%Y-%m-%d %H:%M:%S %Z}, and "
            f"{newest.name!r}, due at {newest.expected_start_time:%Y-%m-%d %H:%M:%S %Z}, rebuilds the "
            f"same corpus; runs of a schedule missed while no worker was up collapse to the newest")


def repeated(run: FlowRun, crashed: FlowRun) -> str | None:
    """Why ``run``, a rerun of the crashed run ``crashed`` (as read when ``run`` started), should
    not build: the crashed run was alive and is Crashed no more (flows/revive.py), or another
    rerun of it claimed it first (the trigger fired twice). None once ``run`` holds the claim.
    The claim is a variable named after the crashed run, which the server creates only while no
    variable has its name (one insert against a unique name: atomic on SQLite and on
    PostgreSQL), so of any number of reruns exactly one builds."""
    if crashed.state is not None and not crashed.state.is_crashed():
        return (f"revived: flow run {crashed.name!r} ({crashed.id}) is {crashed.state.name}, not Crashed: "
                f"the server had marked it Crashed while it ran, and it builds (or built) on")
    name = f"{CLAIM}-{crashed.id}"
    with get_client(sync_client=True) as client:
        _forget_old_claims(client)
        try:
            client.create_variable(VariableCreate(name=name, value=str(run.id), tags=[CLAIM]))
            return None
        except ObjectAlreadyExists:
            held = client.read_variable_by_name(name)
        # Its own (a create the server committed, sent again after a refused answer), or gone.
        if held is None or held.value == str(run.id):
            return None
        try:
            first = f"{client.read_flow_run(UUID(held.value)).name!r} ({held.value})"
        except ObjectNotFound:
            first = held.value
    return (f"repeated: flow run {first} claimed the rerun of this crash first; Prefect's trigger "
            f"scheduled this rerun too (a trigger can act twice for one event)")


def _forget_old_claims(client: SyncPrefectClient) -> None:
    """Delete the claims older than CLAIM_KEPT: the server's variables stay a few."""
    old = datetime.now(timezone.utc) - CLAIM_KEPT
    for variable in client.read_variables():
        if CLAIM in variable.tags and variable.created is not None and variable.created < old:
            with suppress(ObjectNotFound):  # another rerun's clean-up was first
                client.delete_variable_by_name(variable.name)


def run_tree(client: SyncPrefectClient, run_id: UUID) -> list[FlowRun]:
    """The flow run ``run_id`` and its subflow runs, theirs, and so on."""
    frontier = [run_id]
    runs = [client.read_flow_run(run_id)]
    while frontier:
        children = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=frontier)), limit=200)
        runs += children
        frontier = [child.id for child in children]
    return runs


def mark_crashed(holder: Holder, reason: str, by: str) -> list[UUID]:
    """Mark the flow run that held a root's lock, and its unfinished subflow runs, Crashed:
    its process died with the lock (``reason``: the lock's evidence). Returns the runs marked."""
    if not holder.run:
        return []
    message = (f"Crashed: its build's process died ({holder.describe()}: {reason}); "
               f"the corpus root was taken over by {by}")
    marked: list[UUID] = []
    with get_client(sync_client=True) as client:
        for run in run_tree(client, UUID(holder.run)):
            if run.state is not None and not run.state.is_final():
                client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                marked.append(run.id)
    return marked
