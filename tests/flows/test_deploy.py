"""`vlcorpus deploy` refuses, in one line each and before contacting any server, deployments that
could not run as written (a working directory without their configs, no corpus root, a list file
that is not there, a schedule it cannot read) and registers none of them; and, in one line, to
register without a Prefect server to keep the deployments. The schedule forms of Prefect's
prefect.yaml register as written."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml
from conftest import ROOT, vlcorpus


def _deploy(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # An API address nothing listens on: a check that passed would fail to connect instead.
    base = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": "http://127.0.0.1:9/api"}
    return vlcorpus("deploy", *args, cwd=ROOT, env={**base, **(env or {})})


@pytest.mark.parametrize("how", ["option", "environment"])
def test_a_missing_working_directory_is_one_line_at_deploy_time(tmp_path, how):
    missing = tmp_path / "opt" / "vlcorpus"
    if how == "option":
        result = _deploy("--working-dir", str(missing))
    else:
        result = _deploy(env={"VLCORPUS_WORKING_DIR": str(missing)})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert lines[0].startswith(f"vlcorpus deploy: working directory {missing} does not exist;")
    assert "--working-dir" in lines[0]


def test_a_working_directory_without_the_configs_is_refused(tmp_path):
    from flows.deploy import DeployError, deploy

    with pytest.raises(DeployError, match=r"^apartment-tour-weekly: config configs/apartment_tour.yaml "
                                          rf"not found in working directory {tmp_path};"):
        deploy(ROOT / "infra" / "prefect.yaml", tmp_path)


def test_an_unknown_entrypoint_is_refused(tmp_path):
    from flows.deploy import DeployError, deploy

    deployments = tmp_path / "deployments.yaml"
    deployments.write_text(yaml.safe_dump({"deployments": [{
        "name": "old-style", "entrypoint": "flows/build.py:rebuild_corpus",
        "parameters": {"config": "configs/demo.yaml"}, "work_pool": {"name": "vlcorpus"}}]}))
    with pytest.raises(DeployError, match="^old-style: unknown entrypoint flows/build.py:rebuild_corpus; "
                                          "use flows.build.rebuild_corpus"):
        deploy(deployments, ROOT)


@pytest.mark.parametrize("api", ["", "http://127.0.0.1:9/api"])
def test_without_a_prefect_server_deploy_refuses_in_one_line(api):
    """No PREFECT_API_URL (Prefect would register on a temporary server that stops with the
    command) or none answering: one line that says how to start one, exit 2."""
    result = _deploy("--name", "rebuild", env={"PREFECT_API_URL": api})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vlcorpus deploy: no Prefect server")
    assert "prefect server start" in lines[0] and "ERROR" not in result.stderr


def _lines(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    return [line.removeprefix("vlcorpus deploy: ") for line in result.stderr.strip().splitlines()]


@pytest.mark.slow
def test_the_shipped_deployments_are_refused_until_they_have_a_root_and_their_lists(tmp_path):
    lines = _lines(_deploy(env={"VLCORPUS_ROOT": ""}))
    for name, config in [("apartment-tour-weekly", "apartment_tour"), ("spoken-moments-weekly", "spoken_moments"),
                         ("howto100m-monthly", "howto100m")]:
        assert any(line.startswith(f"{name}: no corpus root: config configs/{config}.yaml has no root "
                                   f"and neither the deployment's parameters nor VLCORPUS_ROOT give one")
                   for line in lines), lines
    assert lines[-1] == "(nothing registered; --name rebuild registers the ones that can run)"

    lines = _lines(_deploy(env={"VLCORPUS_ROOT": str(tmp_path / "corpora")}))
    assert lines == [
        f"spoken-moments-weekly: the list source 'smit' of config configs/spoken_moments.yaml reads "
        f"{ROOT / 'configs' / 'spoken_moments.csv'}, which does not exist",
        f"howto100m-monthly: the list source 'howto100m' of config configs/howto100m.yaml reads "
        f"{ROOT / 'configs' / 'HowTo100M_v1.csv'}, which does not exist",
        "(nothing registered; --name apartment-tour-weekly --name rebuild registers the ones that can run)",
    ]


BAD_SCHEDULES = {
    "every-day": ({"every": "day"}, "a schedule has exactly one of cron, interval, rrule (got every)"),
    "two-forms": ({"cron": "0 3 * * *", "interval": 60}, "a schedule has exactly one of cron, interval, rrule"),
    "bad-cron": ({"cron": "0 25 * * *"}, "cron schedule: Value error, Invalid cron string"),
    "bad-zone": ({"cron": "0 3 * * *", "timezone": "Mars/Olympus"}, "Invalid timezone"),
    "negative": ({"interval": -60}, "interval must be a positive number of seconds (got -60)"),
    "bad-anchor": ({"interval": 60, "anchor_date": "monday"}, "interval schedule:"),
    "bad-rrule": ({"rrule": "FREQ=FORTNIGHTLY"}, "rrule schedule: Value error, Invalid RRule string"),
    "stray-key": ({"cron": "0 3 * * *", "day_of": 1}, "cron schedule: unknown key day_of"),
}


def _deployment(schedules: list, name: str = "nightly", **parameters) -> dict:
    return {"name": name, "entrypoint": "flows.build.rebuild_corpus",
            "parameters": {"config": "configs/apartment_tour.yaml", **parameters},
            "schedules": schedules, "work_pool": {"name": "vlcorpus"}}


def _deployments(path, schedules: list, name: str = "nightly", **parameters) -> None:
    path.write_text(yaml.safe_dump({"deployments": [_deployment(schedules, name, **parameters)]}))


def test_a_schedule_deploy_cannot_read_is_one_line_and_exit_2(tmp_path):
    """A deployment per unreadable schedule, all in one file: deploy checks every deployment
    before it registers any, so one command shows each of them refused in a line of its own."""
    (tmp_path / "d.yaml").write_text(yaml.safe_dump({"deployments": [
        _deployment([schedule], name=name, root=str(tmp_path / "c"))
        for name, (schedule, _) in BAD_SCHEDULES.items()]}))
    lines = _lines(_deploy("--file", str(tmp_path / "d.yaml")))
    assert len(lines) == len(BAD_SCHEDULES) + 1, lines
    for line, (name, (_, why)) in zip(lines, BAD_SCHEDULES.items()):
        assert line.startswith(f"{name}: ") and why in line, (name, line)
    assert lines[-1] == "(nothing registered)"


@pytest.mark.slow
def test_the_schedule_forms_of_prefect_yaml_register_as_written(tmp_path, prefect_server):
    from prefect.client.orchestration import get_client

    _deployments(tmp_path / "d.yaml", [
        {"cron": "0 3 * * 1", "timezone": "Europe/Paris", "day_or": False},
        {"interval": 86400, "anchor_date": "2026-01-01T02:30:00", "timezone": "UTC"},
        {"rrule": "FREQ=WEEKLY;BYDAY=MO,TH;BYHOUR=4;BYMINUTE=0", "timezone": "America/New_York",
         "active": False, "parameters": {"until": "discover"}},
    ])
    result = _deploy("--file", str(tmp_path / "d.yaml"), env={"PREFECT_API_URL": prefect_server,
                                                              "VLCORPUS_ROOT": str(tmp_path / "corpora")})
    assert result.returncode == 0, result.stderr
    with get_client(sync_client=True) as client:
        (deployment,) = client.read_deployments()
    assert deployment.parameters == {"config": "configs/apartment_tour.yaml",
                                     "root": str(tmp_path / "corpora" / "apartment_tour")}
    cron, interval, rrule = sorted(deployment.schedules, key=lambda s: type(s.schedule).__name__)
    assert (cron.schedule.cron, cron.schedule.timezone, cron.schedule.day_or) == ("0 3 * * 1", "Europe/Paris", False)
    assert interval.schedule.interval.total_seconds() == 86400
    assert interval.schedule.anchor_date.isoformat().startswith("2026-01-01T02:30:00")
    assert rrule.schedule.rrule.endswith("FREQ=WEEKLY;BYDAY=MO,TH;BYHOUR=4;BYMINUTE=0")  # Prefect adds DTSTART
    assert rrule.schedule.timezone == "America/New_York"
    assert not rrule.active and rrule.parameters == {"until": "discover"}


def test_a_liveness_or_rerun_deploy_cannot_use_is_refused(tmp_path):
    from flows.deploy import DeployError, deploy

    deployments = tmp_path / "d.yaml"
    _deployments(deployments, [], root=str(tmp_path / "c"))
    spec = yaml.safe_load(deployments.read_text())
    spec["liveness"] = {"heartbeat_s": 10}
    deployments.write_text(yaml.safe_dump(spec))
    with pytest.raises(DeployError, match=f"^{deployments}: liveness.heartbeat_s: Input should be greater "
                                          f"than or equal to 30$"):
        deploy(deployments, ROOT)

    spec["liveness"] = {"crashed_after_s": 45}
    spec["deployments"][0].update(entrypoint="flows.build.download_flow", rerun_crashed_after_s=60)
    deployments.write_text(yaml.safe_dump(spec))
    with pytest.raises(DeployError, match="crashed_after_s \\(45\\) must be at least twice heartbeat_s"):
        deploy(deployments, ROOT)
    spec["liveness"] = {}
    deployments.write_text(yaml.safe_dump(spec))
    with pytest.raises(DeployError, match="^nightly: rerun_crashed_after_s needs the entrypoint "
                                          "flows.build.rebuild_corpus, whose runs take the root's lock\n"):
        deploy(deployments, ROOT)


def _wait_for(read, seconds: float = 60):
    import time

    deadline = time.monotonic() + seconds
    while not (found := read()):
        assert time.monotonic() < deadline, "nothing came"
        time.sleep(0.5)
    return found


@pytest.mark.slow
def test_deployed_runs_send_heartbeats_and_a_crashed_run_is_run_again_once(tmp_path, prefect_server):
    """The heartbeats reach the run's process through its job variables, the server gets the
    automation that marks a silent run Crashed, and a Crashed run of a deployment with a rerun
    is run again once with its parameters: the rerun's own crash is not (tests/flows/test_worker.py
    kills a real one)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId
    from prefect.states import Crashed, Running

    from flows.deploy import deploy
    from flows.liveness import NAME, TAG
    from flows.siblings import repeated

    deployments = tmp_path / "d.yaml"
    _deployments(deployments, [], root=str(tmp_path / "c"))
    spec = yaml.safe_load(deployments.read_text())
    spec["liveness"] = {"crashed_after_s": 75}
    spec["deployments"][0]["rerun_crashed_after_s"] = 0
    deployments.write_text(yaml.safe_dump(spec))
    (deployment_id,), _ = deploy(deployments, ROOT)
    with get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
        assert deployment.job_variables["env"] == {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
        assert deployment.tags == [TAG]
        (silent,) = client.read_automations_by_name(NAME)
        # Silent for 75 s after a heartbeat, or after a tagged deployment's run went Running.
        after_heartbeat, after_running = silent.trigger.triggers
        assert silent.trigger.require == "any"
        assert all(t.within.total_seconds() == 75 and t.posture == "Proactive" for t in silent.trigger.triggers)
        assert after_heartbeat.after == {"prefect.flow-run.heartbeat"}
        assert after_running.after == {"prefect.flow-run.Running"}
        assert {"prefect.resource.id": f"prefect.tag.{TAG}"} in [m.model_dump() for m in after_running.match_related]

        def crash(name: str):
            run = client.create_flow_run_from_deployment(deployment_id, name=name,
                                                         parameters={"until": "discover"})
            client.set_flow_run_state(run.id, Running(), force=True)
            client.set_flow_run_state(run.id, Crashed(message="its process died"), force=True)
            return run

        def runs() -> list:
            return client.read_flow_runs(flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[deployment_id])))

        def reruns_of(name: str) -> list:
            return [r for r in runs() if r.parameters.get("rerun_of") == name]

        crash("nightly-1")
        reruns = _wait_for(lambda: reruns_of("nightly-1"))
        assert all(r.parameters == {"config": "configs/apartment_tour.yaml", "root": str(tmp_path / "c"),
                                    "until": "discover", "dask_address": None, "retry_failed": False,
                                    "rerun_of": "nightly-1"} for r in reruns)
        # A second firing of the trigger for the same crash (Prefect acts at least once: it did
        # under SQLite's "database is locked") schedules a twin, which steps aside for the first.
        twin = client.create_flow_run_from_deployment(deployment_id, parameters=reruns[0].parameters)
        twin = client.read_flow_run(twin.id)
        reruns = reruns_of("nightly-1")
        first = min(reruns, key=lambda r: (r.created, str(r.id)))
        assert [r.id for r in reruns if repeated(r, "nightly-1") is None] == [first.id]
        assert repeated(twin, "nightly-1").startswith(f"repeated: {first.name!r} runs 'nightly-1' again already")
        # The rerun names itself so when it starts; crashed too, it is not run again.
        crash("nightly-1-rerun")
        crash("nightly-2")
        assert [r for r in _wait_for(lambda: reruns_of("nightly-2")) if repeated(r, "nightly-2") is None]
        assert not reruns_of("nightly-1-rerun")
        assert {r.parameters.get("rerun_of") for r in runs()} == {None, "nightly-1", "nightly-2"}
