"""`vlcorpus deploy` refuses, in one line each and before contacting any server, deployments that
could not run as written (a working directory without their configs, no corpus root, a list file
that is not there, a schedule it cannot read) and registers none of them; and, in one line, to
register without a Prefect server to keep the deployments (one slow to answer is waited for as
long as Prefect's client waits). The schedule forms of Prefect's
prefect.yaml register as written. A deployment's crashed run is run again, and alerted, exactly
once."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager, suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, vlcorpus
from hookkit import webhook
from rerunkit import claims_at_once, crash, reruns_of, wait_for

sys.path.insert(0, str(ROOT / "infra"))  # infra/alerts.py


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


# Longer than the 10 s the health check once waited: a busy server (its SQLite in a long write, at
# the suite's start) answered later than that, and deploy said no server answered.
HELD_S = 12


@contextmanager
def _slow_health(api_url: str) -> Iterator[str]:
    """The API of ``api_url`` behind a proxy on 127.0.0.1 that answers the health check HELD_S late."""
    upstream = api_url.removesuffix("/api")

    class Forward(BaseHTTPRequestHandler):
        def _forward(self) -> None:
            if self.path == "/api/health":
                time.sleep(HELD_S)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0)) or None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            request = urllib.request.Request(upstream + self.path, body, headers, method=self.command)
            try:
                reply = urllib.request.urlopen(request, timeout=60)
            except urllib.error.HTTPError as exc:
                reply = exc
            with reply:
                data = reply.read()
                self.send_response(reply.status)
                for key, value in reply.headers.items():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection", "date", "server"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Forward)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_a_server_slow_to_answer_is_waited_for_as_long_as_prefects_client_waits(tmp_path, prefect_server):
    """`vlcorpus deploy` as typed waits for the health check PREFECT_API_REQUEST_TIMEOUT (60 s by
    default), as every request of Prefect's client does, and registers; past it, it says in one
    line that no server answers."""
    from prefect.client.orchestration import get_client

    _deployments(tmp_path / "d.yaml", [])
    env = {"VLCORPUS_ROOT": str(tmp_path / "corpora")}
    with _slow_health(prefect_server) as slow:
        result = _deploy("--file", str(tmp_path / "d.yaml"), env={**env, "PREFECT_API_URL": slow})
        assert result.returncode == 0, result.stderr
        lines = _lines(_deploy("--file", str(tmp_path / "d.yaml"),
                               env={**env, "PREFECT_API_URL": slow, "PREFECT_API_REQUEST_TIMEOUT": "1"}))
    assert len(lines) == 1 and lines[0].startswith(f"no Prefect server answers at PREFECT_API_URL={slow} (timed out)")
    with get_client(sync_client=True) as client:
        assert [d.name for d in client.read_deployments()] == ["nightly"]


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


def dead_lettered(run_id) -> bool:
    """Whether the server of this process's PREFECT_HOME gave up on an event of the run: every
    automation evaluates an event again when one of them fails, three times, then Prefect's
    in-memory messaging moves it to its dead-letter queue (PREFECT_HOME/dlq); no automation acts
    on it, nor on the run's later events, which wait for it."""
    dlq = Path(os.environ["PREFECT_HOME"]) / "dlq"
    return dlq.is_dir() and any(f"prefect.flow-run.{run_id}" in message.read_text(errors="replace")
                                for message in dlq.iterdir())


def failed_actions(log: str, action: str) -> int:
    """How many of the server's actions of a kind (``run-deployment``, ``send-notification``)
    its log says failed: a 503 from its own API under a busy SQLite, which Prefect does not try
    again."""
    return sum(f"'{action}' action" in line for line in log.splitlines() if "Action failed" in line)


@contextmanager
def _second_writer(database: str, every_s: float = 0.5) -> Iterator[list[int]]:
    """Another writer on the server's SQLite database, committing every ``every_s``: SQLite then
    refuses the server's transactions that read before one of its commits and write after it
    ("database is locked"), as on a server busy with builds. Yields its count of commits."""
    done, commits = threading.Event(), [0]

    def write() -> None:
        with closing(sqlite3.connect(database, timeout=60, isolation_level=None)) as db:
            db.execute("CREATE TABLE IF NOT EXISTS second_writer (at REAL)")
            while not done.wait(every_s):
                with suppress(sqlite3.OperationalError):  # the server held the lock too long
                    db.execute("INSERT INTO second_writer VALUES (?)", (time.time(),))
                    commits[0] += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        yield commits
    finally:
        done.set()
        writer.join()


@pytest.mark.slow
def test_deployed_runs_send_heartbeats_and_a_crashed_run_is_rerun_and_alerted_exactly_once(tmp_path, capfd,
                                                                                           temporary_server):
    """The heartbeats reach the run's process through its job variables, the server gets the
    automation that marks a silent or stuck-Pending run Crashed, and a Crashed run of a deployment
    with a rerun is run again exactly once, with its parameters, and alerted exactly once,
    however often the server evaluates its Crashed event: marked Crashed twice, and with the
    server's SQLite under contention; the rerun's own crash is not run again. Should the trigger
    schedule a second rerun all the same, one of them claims the crash, atomically, and a crashed
    run that is Running again is not run again (tests/flows/test_worker.py kills a real build)."""
    from alerts import install
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings
    from prefect.states import Running

    from flows.deploy import deploy
    from flows.liveness import NAME, TAG
    from flows.siblings import repeated

    deployments = tmp_path / "d.yaml"
    _deployments(deployments, [], root=str(tmp_path / "c"))
    spec = yaml.safe_load(deployments.read_text())
    spec["liveness"] = {"crashed_after_s": 75}
    spec["deployments"][0].update(rerun_crashed_after_s=0, work_pool={"name": "no-worker"})  # reruns stay Scheduled
    deployments.write_text(yaml.safe_dump(spec))
    (deployment_id,), _ = deploy(deployments, ROOT)
    # This test's requests outlast the second writer's refusals.
    with webhook() as hook, temporary_settings({PREFECT_CLIENT_MAX_RETRIES: 10}), \
            get_client(sync_client=True) as client:
        deployment = client.read_deployment(deployment_id)
        assert deployment.job_variables["env"] == {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
        assert deployment.tags == [TAG]
        (silent,) = client.read_automations_by_name(NAME)
        # Silent for 75 s after a heartbeat, after a tagged deployment's run went Running, or
        # after one, or a subflow run, went Pending.
        after_heartbeat, after_running, after_pending, subflow_pending = silent.trigger.triggers
        assert silent.trigger.require == "any"
        assert all(t.within.total_seconds() == 75 and t.posture == "Proactive" for t in silent.trigger.triggers)
        assert after_heartbeat.after == {"prefect.flow-run.heartbeat"}
        assert after_running.after == {"prefect.flow-run.Running"}
        assert {"prefect.resource.id": f"prefect.tag.{TAG}"} in [m.model_dump() for m in after_running.match_related]
        for pending, related in ((after_pending, {"prefect.resource.id": f"prefect.tag.{TAG}"}),
                                 (subflow_pending, {"prefect.resource.role": "task-run"})):
            assert pending.after == {"prefect.flow-run.Pending"} and "prefect.flow-run.Running" in pending.expect
            assert related in [m.model_dump() for m in pending.match_related]
        # Registered again, each automation is updated in place: one deleted and created anew would
        # fail the events the server evaluates meanwhile (flows/automations.py).
        alert = install(hook.url, allow_private=True)
        deploy(deployments, ROOT)
        again = [install(hook.url, allow_private=True), *client.read_automations_by_name(NAME)]
        assert [(a.id, a.name) for a in again] == [(alert.id, alert.name), (silent.id, NAME)]

        crashed = [crash(client, deployment_id, "nightly-1", times=2, until="discover")]
        log = []  # the server's log so far

        def without(counts: list[int], action: str) -> int:
            """How many runs, of those whose events the server did not give up on, have no
            rerun (or alert) more than the failed actions of that kind account for."""
            log.append(capfd.readouterr().err)
            missing = sum(not n for run, n in zip(crashed, counts, strict=True) if not dead_lettered(run.id))
            return max(0, missing - failed_actions("".join(log), action))

        def reruns() -> list[int]:
            return [len(reruns_of(client, deployment_id, run)) for run in crashed]

        def alerts() -> list[int]:
            return [len(hook.with_line(f"vlcorpus: {run.name} (nightly)")) for run in crashed]

        def why() -> str:
            return (f"reruns {list(zip([r.name for r in crashed], reruns()))}, alerts {hook.texts}, events given up "
                    f"for {[r.name for r in crashed if dead_lettered(r.id)]}, failed actions: "
                    + "".join(line for line in "".join(log).splitlines(True) if "Action failed" in line))

        def settled() -> None:
            wait_for(lambda: not without(reruns(), "run-deployment") and not without(alerts(), "send-notification"),
                     why=why)

        with _second_writer(temporary_server.database) as commits:
            crashed += [crash(client, deployment_id, f"busy-{i}") for i in range(3)]
        # nightly-2 crashes once the server has done with the contended ones' events.
        settled()
        crashed.append(crash(client, deployment_id, "nightly-2", times=2, until="discover"))
        settled()
        # Each at most once: the server evaluates an event again within seconds, and nightly-2's
        # came last. Every run was rerun and alerted unless the server gave up on its event or
        # failed the action, which a busy SQLite does (the contended one, or a loaded machine's:
        # infra/README.md), but not to all of those crashed without the second writer, nor to
        # all of those crashed with it: the test is of the events evaluated again and again.
        assert max(reruns()) == 1 and max(alerts()) == 1, why()
        assert 1 in [reruns()[i] for i in (0, -1)] and 1 in [alerts()[i] for i in (0, -1)], why()
        assert any(n == 1 for n in reruns()[1:-1]), why()
        # Of the two marked Crashed twice, one rerun at least (asserted above) with the parameters.
        twice = next(run for run in (crashed[0], crashed[-1]) if reruns_of(client, deployment_id, run))
        (rerun,) = reruns_of(client, deployment_id, twice)
        assert rerun.parameters == {"config": "configs/apartment_tour.yaml", "root": str(tmp_path / "c"),
                                    "until": "discover", "dask_address": None, "retry_failed": False,
                                    "rerun_of": str(twice.id)}

        # Twins made by hand, as a trigger that acted twice would: of all asking at once, one
        # claims the crash, and the others name it.
        twins = [client.create_flow_run_from_deployment(deployment_id, parameters=rerun.parameters)
                 for _ in range(3)]
        said = claims_at_once([rerun, *twins], twice)
        assert said.count(None) == 1, said
        first = [rerun, *twins][said.index(None)]
        assert all(reason.startswith(f"repeated: flow run {first.name!r} ({first.id}) claimed the rerun of this "
                                     f"crash first")
                   for reason in said if reason is not None), said
        assert claims_at_once([first], twice) == [None]  # its own claim, asked again
        # A crashed run that is Running again (flows/revive.py) is not run again.
        alive = crash(client, deployment_id, "alive")
        client.set_flow_run_state(alive.id, Running(), force=True)
        said = repeated(twins[0], client.read_flow_run(alive.id))
        assert said.startswith(f"revived: flow run 'alive' ({alive.id}) is Running, not Crashed"), said

        # The rerun names itself so when it starts; crashed too, it is not run again, while a run
        # crashed after it is. Both crashed again where the server gave up either's event or
        # failed the later one's rerun (a loaded machine's SQLite, as in settled()).
        for attempt in range(3):
            again = crash(client, deployment_id, f"{twice.name}-rerun")
            after = crash(client, deployment_id, f"nightly-{3 + attempt}")
            failed_before = failed_actions("".join(log), "run-deployment")

            def decided(after=after, failed_before=failed_before) -> bool:
                log.append(capfd.readouterr().err)
                return bool(reruns_of(client, deployment_id, after)) or dead_lettered(after.id) \
                    or failed_actions("".join(log), "run-deployment") > failed_before

            wait_for(decided, why=why)
            if reruns_of(client, deployment_id, after) and not dead_lettered(again.id):
                break
        else:
            pytest.fail(f"no crash after the rerun's was rerun: {why()}")
        assert not reruns_of(client, deployment_id, again)
    print(f"the second writer committed {commits[0]} times")
