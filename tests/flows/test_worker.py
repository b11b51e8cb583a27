"""The worker path of infra/README.md with real processes, as a user types it: `prefect server
start`, `vlcorpus deploy`, `prefect worker start --pool vlcorpus`, `prefect deployment run`.
The `rebuild` deployment builds a generated site (going back to Running when marked Crashed for
a silence while it builds) and resumes with nothing redone, a schedule
fires by itself, overlapping builds of one root never interleave, a build killed with its
worker is marked Crashed by the server, alerted once and run again (and so are runs that died
Running or Pending before sending a heartbeat), Prefect's own list commands work
against the server, and its run history stays bounded. Each test ends by checking that the
server's scheduler logged no error (with SQLAlchemy 2.1 it fails on every pass, and says so
only there)."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from uuid import UUID

import psutil
import pytest
import yaml

from conftest import ROOT, dask_cluster, ended, spare_port, stop_group
from docskit import shell
from hookkit import Hook, webhook

BIN = Path(sys.executable).parent
README = ROOT / "infra" / "README.md"
# infra/README.md's "On one machine" block, command by command.
ONE_MACHINE = [
    "make secrets",
    "set -a && . infra/.env && set +a",
    "prefect config set PREFECT_SERVER_ANALYTICS_ENABLED=false",
    "prefect config set PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED=events,flow_runs "
    "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD=2592000",
    "prefect server start",
    "export PREFECT_API_URL=http://127.0.0.1:4200/api",
    "vlcorpus deploy --name rebuild",
    "prefect worker start --pool vlcorpus",
    "prefect deployment run rebuild_corpus/rebuild -p config=configs/my.yaml",
    "prefect flow-run ls",
]
# Its "On a Dask cluster" block: where builds start, the client's TLS settings; a run there.
CLIENT_TLS = "set -a && . infra/tls/client.env && set +a"
ON_A_CLUSTER = ("prefect deployment run rebuild_corpus/rebuild -p config=configs/my.yaml "
                "-p dask_address=tls://HOST:8786")
# infra/README.md's alert, as typed there.
ALERTS = "python infra/alerts.py --webhook https://hooks.slack.com/services/T000/B000/XXXX"
LISTINGS = ["prefect deployment ls", "prefect work-pool ls", "prefect automation ls", "prefect flow-run ls",
            "prefect gcl ls"]
# The errors Prefect's server logs on SQLite while builds run, each a write that SQLite's one
# writer refused (infra/README.md says which; Stack.quiet): the worker's heartbeat, the write
# after each of its polls (its queues' last poll, written again at the next), the event consumer
# that evaluates the Crashed automation, and a run's state change, which the server logs before
# it answers 503 and the client sends it again (prefect/server/orchestration/rules.py), and the
# task-run recorder's flush of a batch of events, which it tries again ("1 to retry, 0 dropped").
PREFECT_SQLITE_REFUSALS = ("Worker channel heartbeat persistence failed", "mark_work_queues_ready",
                           "Failed in consume_loop", "Encountered error during state validation",
                           "Worker channel setup failed due to a transient server error",
                           "Error flushing")


def _refused(record: str) -> bool:
    """Whether a logged error is one of PREFECT_SQLITE_REFUSALS."""
    return any(what in record.split("\n", 1)[0] for what in PREFECT_SQLITE_REFUSALS) \
        and "database is locked" in record


def _sh_blocks(text: str) -> list[list[str]]:
    """The commands of each ```sh block, comments dropped."""
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [[line.split(" #")[0].strip() for line in block.splitlines() if line.strip()]
            for block in blocks]


def test_readme_shows_the_commands_these_tests_run():
    blocks = _sh_blocks(README.read_text())
    assert blocks[0] == ONE_MACHINE
    assert any(block[-2:] == [CLIENT_TLS, ON_A_CLUSTER] for block in blocks)
    assert any(ALERTS in block for block in blocks)


@dataclass
class Stack:
    """A Prefect server and a worker of the `vlcorpus` pool, both started as a user would."""

    api_url: str
    env: dict[str, str]
    server_log: Path
    database: Path
    worker_log: Path
    config: Path
    start_worker: Callable[[], subprocess.Popen]
    worker: subprocess.Popen | None = None

    def run(self, command: str | list[str], timeout: float = 300) -> subprocess.CompletedProcess:
        argv = shlex.split(command) if isinstance(command, str) else command
        return subprocess.run([str(BIN / argv[0]), *argv[1:]], cwd=ROOT, env=self.env,
                              capture_output=True, text=True, timeout=timeout)

    def errors(self) -> list[str]:
        """The errors the server logged (each with its traceback)."""
        records = re.split(r"\n(?=\d\d:\d\d:\d\d\.\d+ \| )", self.server_log.read_text())
        return [record for record in records if "| ERROR" in record.split("\n", 1)[0]]

    def scheduler_errors(self) -> list[str]:
        """The errors the server logged while scheduling runs (a refused write that names a
        Scheduled state aside)."""
        return [record for record in self.errors() if "schedul" in record.lower() and not _refused(record)]

    def quiet(self) -> None:
        """The server logged no error but SQLite's refusals (PREFECT_SQLITE_REFUSALS, each
        "database is locked"; infra/README.md says so): every request of the builds went
        through, a refused state change on its client's second try."""
        errors = self.errors()
        print(f"server log: {len(errors)} errors, {sum('database is locked' in e for e in errors)} "
              f"'database is locked'")
        assert all(_refused(error) for error in errors), errors

    def trigger(self, *parameters: str) -> UUID:
        """`prefect deployment run rebuild_corpus/rebuild -p config=...` plus ``parameters``;
        the flow run's id."""
        command = shlex.split(ONE_MACHINE[8].replace("configs/my.yaml", str(self.config)))
        for parameter in parameters:
            command += ["-p", parameter]
        result = self.run(command)
        assert result.returncode == 0, result.stdout + result.stderr
        return UUID(re.search(r"UUID: ([0-9a-f-]{36})", result.stdout).group(1))


def _wait_up(url: str, proc: subprocess.Popen, log: Path, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"prefect server did not come up:\n{log.read_text()[-3000:]}") from None
            time.sleep(0.5)


@pytest.fixture(scope="module")
def stack(tmp_path_factory, demo_corpus) -> Iterator[Stack]:
    from pipeline.demo import serve_demo

    _, site = demo_corpus
    base = tmp_path_factory.mktemp("worker")
    # The telemetry setting comes from the profile that README's first command writes; the
    # server's port (PREFECT_SERVER_API_PORT, PREFECT_API_URL) is set below.
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_SERVER_ANALYTICS_ENABLED"},
           "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(base / "prefect-home"),
           "PREFECT_WORKER_QUERY_SECONDS": "2",
           # The server's clean-up of old runs looks every 2 s instead of hourly.
           "PREFECT_SERVER_SERVICES_DB_VACUUM_LOOP_SECONDS": "2",
           # Rich tables as wide as the names they list.
           "COLUMNS": "250"}
    server_log, worker_log = base / "server.log", base / "worker.log"
    procs: list[subprocess.Popen] = []

    def start(command: str, log: Path) -> subprocess.Popen:
        argv = shlex.split(command)
        server_env = {k: v for k, v in env.items() if k != "PREFECT_API_URL"}
        with log.open("w") as out:
            proc = subprocess.Popen([str(BIN / argv[0]), *argv[1:]], cwd=ROOT, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True,
                                    env=server_env if argv[1] == "server" else env)
        procs.append(proc)
        return proc

    try:
        # The secrets, made once in the repository (git ignores them) and taken into this
        # environment; and, where builds start, the Dask client's TLS settings of "On a Dask
        # cluster", which the Prefect worker's runs take to a cluster (a local one makes its own).
        env = shell([*ONE_MACHINE[:2], CLIENT_TLS], env)
        # Into the profile under this PREFECT_HOME, as a user's goes into ~/.prefect.
        for command in ONE_MACHINE[2:4]:
            configured = subprocess.run([str(BIN / "prefect"), *shlex.split(command)[1:]], env=env,
                                        capture_output=True)
            assert configured.returncode == 0, configured.stderr
        # `prefect server start` takes the port it is told: another one if a process beside
        # this test took that one first.
        for attempt in range(3):
            port = spare_port()
            api_url = ONE_MACHINE[5].split("=", 1)[1].replace("4200", str(port))
            env.update(PREFECT_SERVER_API_PORT=str(port), PREFECT_API_URL=api_url)
            server = start(ONE_MACHINE[4], server_log)
            try:
                _wait_up(api_url, server, server_log)
                break
            except AssertionError:
                if attempt == 2 or "address already in use" not in server_log.read_text().lower():
                    raise
                stop_group(server)
                procs.remove(server)
        with serve_demo(site):
            urls = base / "urls.txt"
            shutil.copy(site / "urls.txt", urls)
            config = base / "worker-test.yaml"
            config.write_text(yaml.safe_dump({
                "name": "worker-test",
                # Beside the config: read there by a worker that runs in the repository.
                "sources": [{"type": "list", "path": urls.name}],
                "download": {"subtitle_langs": ["en", "en-auto"]},
                "transcribe": {"prefer": ["manual", "auto"]},
                "align": {"splits": {"train": 0.5, "val": 0.0, "test": 0.5}},
                "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}]},
                "frames": {"short_side": 64, "crop": 56},  # small: CPU featurize is not what this tests
                "execution": {"n_workers": 1, "batch_size": 4, "retry_backoff_s": 0},
            }))
            stack = Stack(api_url, env, server_log, base / "prefect-home" / "prefect.db", worker_log, config,
                          start_worker=lambda: start(ONE_MACHINE[7], worker_log))
            deployed = stack.run(ONE_MACHINE[6])
            assert deployed.returncode == 0, deployed.stdout + deployed.stderr
            assert f"registered 1 deployment from infra/prefect.yaml; workers run them in {ROOT}" in deployed.stderr
            stack.worker = stack.start_worker()
            yield stack
    finally:
        for proc in reversed(procs):
            stop_group(proc)


@pytest.fixture(autouse=True)
def _api(request, monkeypatch):
    """This process talks to the stack's server, and so do the Dask workers it starts (through
    the environment)."""
    if "stack" not in request.fixturenames:
        yield
        return
    # Prefect reads the environment once, when first imported: import it before setting the
    # variables, so that tests after these do not inherit a server that is gone.
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    stack = request.getfixturevalue("stack")
    settings = {PREFECT_API_URL: stack.api_url, PREFECT_API_AUTH_STRING: stack.env["PREFECT_API_AUTH_STRING"]}
    for setting, value in settings.items():
        monkeypatch.setenv(setting.name, value)
    with temporary_settings(settings):
        yield


def _client():
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _wait_final(run_id: UUID, stack: Stack, seconds: float = 600, *, live: bool = True):
    """The run once it ended; ``live``: its process lives, so a Crashed for silence is not its end
    (conftest.ended)."""
    deadline = time.monotonic() + seconds
    with _client() as client:
        while True:
            run = client.read_flow_run(run_id)
            over = ended(run.state) if live else run.state is not None and run.state.is_final()
            if over:
                return run
            if time.monotonic() > deadline:
                raise AssertionError(f"flow run {run.name} still {run.state.name} ({run.state.message}); "
                                     f"worker log:\n{stack.worker_log.read_text()[-4000:]}")
            time.sleep(1)


def _run_tree(client, run_id: UUID) -> list:
    """The flow run and its subflow runs, all levels down (``flows.siblings.run_tree``, imported
    only when called: collecting this module imports no Prefect)."""
    from flows.siblings import run_tree

    return run_tree(client, run_id)


def _logs(run_id: UUID) -> list[str]:
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.client.schemas.sorting import LogSort

    messages: list[str] = []
    with _client() as client:
        ids = [run.id for run in _run_tree(client, run_id)]
        while True:  # the server gives at most 200 a page
            page = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=ids)),
                                    limit=200, offset=len(messages), sort=LogSort.TIMESTAMP_ASC)
            messages += [log.message for log in page]
            if len(page) < 200:
                return messages


def _logs_with(run_id: UUID, wanted, timeout: float = 60) -> list[str]:
    """The run's logs once one of them satisfies `wanted`: the flow's process ships its logs in
    batches, so the last ones may reach the server after the run's final state."""
    deadline = time.monotonic() + timeout
    messages = _logs(run_id)
    while not any(wanted(m) for m in messages) and time.monotonic() < deadline:
        time.sleep(1)
        messages = _logs(run_id)
    return messages


def _completed(run, stack: Stack) -> None:
    assert run.state.is_completed(), (f"{run.name}: {run.state.name} {run.state.message}\n"
                                      f"{stack.worker_log.read_text()[-4000:]}")


def _table_files(root: Path) -> dict[str, int]:
    """Every committed table file and shard, with its modification time."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns
            for p in root.rglob("*") if p.suffix in (".parquet", ".tar")}


def _marked_silent(run_id: UUID, root: Path) -> None:
    """The run ``run_id`` marked Crashed for silence, as the liveness automation marks it, once it
    builds (holds its root's lock): what a server too busy to take a live run's heartbeats in did,
    at the suite's start on a slow 2-core machine."""
    from prefect.states import Crashed

    from flows.liveness import Liveness

    deadline = time.monotonic() + 300
    while not (root / "_lock.json").exists():
        assert time.monotonic() < deadline, f"the build of {root} never took its lock"
        time.sleep(0.2)
    with _client() as client:
        client.set_flow_run_state(run_id, Crashed(message=Liveness().message()), force=True)


@pytest.mark.slow
def test_rebuild_runs_on_the_worker_then_resumes_with_nothing_redone(stack, tmp_path):
    """The first build, marked Crashed for silence while it runs, sets itself Running again
    (flows/revive.py) and completes; the second, on an existing Dask cluster, finds nothing to do."""
    from pipeline.corpus.storage import Corpus

    root = tmp_path / "corpus"
    run_id = stack.trigger(f"root={root}")
    _marked_silent(run_id, root)
    first = _wait_final(run_id, stack)
    _completed(first, stack)
    again = "and it is Running again"
    assert any(again in m for m in _logs_with(first.id, lambda m: again in m)), _logs(first.id)
    corpus = Corpus(str(root))
    assert {"videos", "downloads", "segments", "clips", "features/resnet34", "errors"} <= set(corpus.tables())
    assert (root / "shards" / "parquet" / "index.json").exists()
    assert (root / "report" / "report.html").exists()
    built = _table_files(root)
    assert any(name.startswith("clips/") for name in built)

    # The same deployment on an existing Dask cluster, as infra/README.md shows.
    with dask_cluster(tmp_path, [("cpu", [])], tls=True) as (address, _):
        command = ON_A_CLUSTER.replace("configs/my.yaml", str(stack.config)).replace(
            "tls://HOST:8786", address)
        result = stack.run(f"{command} -p root={root}")
        assert result.returncode == 0, result.stderr
        run_id = UUID(re.search(r"UUID: ([0-9a-f-]{36})", result.stdout).group(1))
        second = _wait_final(run_id, stack)
    _completed(second, stack)
    # Every partition's summary says it has nothing to do: the rebuild runs no task for them.
    idle = f"{len(corpus.labels())} partitions have nothing to do (from their summaries): no tasks for them"
    logs = _logs_with(second.id, lambda m: m == idle)
    assert idle in logs, logs
    assert not [m for m in logs if m.endswith(" to do") and not m.endswith(" 0 to do")], logs
    assert _table_files(root) == built

    listings = {command: stack.run(command, timeout=120) for command in LISTINGS}
    for command, result in listings.items():
        assert result.returncode == 0, (command, result.stdout + result.stderr)
    assert "rebuild_corpus/rebuild" in listings["prefect deployment ls"].stdout
    assert "vlcorpus" in listings["prefect work-pool ls"].stdout
    assert "rebuild_corpus" in listings["prefect flow-run ls"].stdout
    assert "vlcorpus-download" in listings["prefect gcl ls"].stdout
    assert "vlcorpus-crashed-when-silent" in listings["prefect automation ls"].stdout
    assert "telemetry" not in stack.server_log.read_text()  # README's profile setting holds
    stack.quiet()


@pytest.mark.slow
def test_a_schedule_fires_and_the_worker_runs_it(stack, tmp_path):
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName, FlowRunFilter
    from prefect.client.schemas.filters import FlowRunFilterDeploymentId

    from pipeline.corpus.storage import Corpus

    root = tmp_path / "scheduled"
    deployments = tmp_path / "scheduled.yaml"
    deployments.write_text(yaml.safe_dump({"deployments": [{
        "name": "every-minute",
        "entrypoint": "flows.build.rebuild_corpus",
        "parameters": {"config": str(stack.config), "root": str(root), "until": "discover"},
        "schedules": [{"cron": "* * * * *", "timezone": "UTC"}],
        "work_pool": {"name": "vlcorpus"},
        "concurrency_limit": {"limit": 1, "collision_strategy": "ENQUEUE"},
    }]}))
    result = stack.run(f"vlcorpus deploy --file {deployments}")
    assert result.returncode == 0, result.stdout + result.stderr
    with _client() as client:
        (deployment,) = client.read_deployments(deployment_filter=DeploymentFilter(
            name=DeploymentFilterName(any_=["every-minute"])))
        try:
            deadline = time.monotonic() + 300
            while True:
                runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    deployment_id=FlowRunFilterDeploymentId(any_=[deployment.id])))
                done = [run for run in runs if ended(run.state)]
                if done:
                    break
                assert time.monotonic() < deadline, (
                    f"no scheduled run finished: {[(r.name, r.state_name) for r in runs]}\n"
                    f"{stack.server_log.read_text()[-3000:]}")
                time.sleep(2)
        finally:
            client.delete_deployment(deployment.id)
    _completed(done[0], stack)
    assert done[0].auto_scheduled
    assert Corpus(str(root)).done("videos")
    assert stack.scheduler_errors() == []


@pytest.mark.slow
def test_overlapping_builds_of_one_root_never_interleave(stack, tmp_path):
    """A build that another deployment (or `vlcorpus build`) runs on the root holds its lock, and
    two runs of this deployment come due meanwhile: both wait for it, then take the root one at a
    time (the root lock keeps runs apart as it keeps them from the other build). One of them,
    marked Crashed for silence as it waits (its heartbeats lost on a busy server: seen here on
    SQLite), goes back to Running and completes (flows/revive.py)."""
    from prefect.states import Crashed

    from flows.liveness import Liveness
    from pipeline.corpus.rootlock import root_lock
    from pipeline.corpus.storage import Corpus

    root = tmp_path / "locked"
    with root_lock(str(root), "the other build"):
        ids = [stack.trigger(f"root={root}", "until=discover") for _ in range(2)]
        deadline = time.monotonic() + 300
        while not all(any("is being built by the other build" in m for m in _logs(run_id)) for run_id in ids):
            assert time.monotonic() < deadline, stack.worker_log.read_text()[-4000:]
            time.sleep(1)
        with _client() as client:
            assert all(client.read_flow_run(run_id).state.is_running() for run_id in ids)
            client.set_flow_run_state(ids[0], Crashed(message=Liveness().message()), force=True)
            while not client.read_flow_run(ids[0]).state.is_running():
                assert time.monotonic() < deadline, stack.worker_log.read_text()[-4000:]
                time.sleep(1)
        assert not Corpus(str(root)).table_files("videos")
    runs = [_wait_final(run_id, stack) for run_id in ids]
    for run in runs:
        _completed(run, stack)
        logs = _logs_with(run.id, lambda m: "lock taken after waiting" in m)
        assert any("lock taken after waiting" in m for m in logs), logs
    revived = _logs_with(ids[0], lambda m: "it is Running again" in m)
    assert any("marked this run Crashed while it ran" in m for m in revived), revived
    assert Corpus(str(root)).done("videos")
    # Each build's subflow runs ran inside its lock: the one taken later began after the other's ended.
    first, second = sorted((_build_span(run.id) for run in runs))
    assert first[1] <= second[0], (first, second)
    assert stack.scheduler_errors() == []


def _build_span(run_id: UUID) -> tuple:
    """When the subflow runs of flow run ``run_id`` (its build, all run under the root's lock)
    started and when the last of them ended."""
    with _client() as client:
        subflows = _run_tree(client, run_id)[1:]
    assert subflows, run_id
    return min(run.start_time for run in subflows), max(run.end_time for run in subflows)


def _sql(database: Path) -> contextlib.closing[sqlite3.Connection]:
    """A connection to the server's SQLite database beside the server, whose writes take the
    write lock before they read (BEGIN IMMEDIATE), so that SQLite never refuses them midway."""
    return contextlib.closing(sqlite3.connect(database, timeout=60, isolation_level="IMMEDIATE"))


def _age(database: Path, days: int) -> None:
    """Move every run's end and every event ``days`` into the past, as that many nights would:
    the server's clean-up goes by those times."""
    shift = "strftime('%Y-%m-%d %H:%M:%S', {0}, '-{1} days') || substr({0}, 20)"  # keeps the µs
    with _sql(database) as db, db:
        db.execute(f"UPDATE flow_run SET end_time = {shift.format('end_time', days)} WHERE end_time IS NOT NULL")
        for table in ("events", "event_resources"):
            db.execute(f"UPDATE {table} SET occurred = {shift.format('occurred', days)}")


def _history(database: Path) -> dict[str, int]:
    """What the server's database holds once its clean-up has deleted the runs past README's
    retention (30 days) and the events past Prefect's (7 days)."""
    deadline = time.monotonic() + 120
    with _sql(database) as db:
        while db.execute("SELECT (SELECT count(*) FROM flow_run WHERE end_time < datetime('now', '-30 days'))"
                         " + (SELECT count(*) FROM events WHERE occurred < datetime('now', '-7 days'))").fetchone()[0]:
            assert time.monotonic() < deadline, "the server deleted no old runs or events"
            time.sleep(1)
        figures = {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                   for table in ("flow_run", "task_run", "log", "events")}
        # The file once its write-ahead log is copied in: that log is bounded on its own
        # (SQLite checkpoints it every 1000 pages), and how full it is depends on the moment.
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        figures["free_pages"] = db.execute("PRAGMA freelist_count").fetchone()[0]
    figures["bytes"] = database.stat().st_size
    return figures


@pytest.mark.slow
def test_the_run_history_stays_bounded_under_nightly_builds(stack, tmp_path):
    """README's fourth line: the server deletes the runs that ended over 30 days ago. Each night
    is a build of a new root (all its task runs new), after which every run and event is aged 16
    days: a night's runs are deleted once the next night's are built. From the second night the
    database holds one night's runs, and its size stays flat."""
    nights = []
    for night in range(3):
        _completed(_wait_final(stack.trigger(f"root={tmp_path / f'night-{night}'}", "until=align"), stack), stack)
        _age(stack.database, days=16)
        nights.append(_history(stack.database))
    print(f"Prefect database after each night: {nights}")
    assert nights[1]["task_run"] > 0
    assert nights[2]["task_run"] == nights[1]["task_run"]
    # Deleted runs leave free pages that the next night's writes reuse.
    assert nights[2]["bytes"] <= nights[1]["bytes"] * 1.05, nights
    stack.quiet()


def _kill_tree(pids: list[int]) -> None:
    """SIGKILL these processes and every process under them: a machine that lost power."""
    victims = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            process = psutil.Process(pid)
            victims += [process, *process.children(recursive=True)]
    for process in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()
    psutil.wait_procs(victims, timeout=30)


def _flow_processes(run_id: UUID) -> list[int]:
    """The processes running flow run ``run_id`` (the worker starts them with its id in the
    environment)."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get("PREFECT__FLOW_RUN_ID") == str(run_id):
                found.append(process.pid)
    return found


@contextlib.contextmanager
def _alert_hook(stack: Stack) -> Iterator[Hook]:
    """A webhook on 127.0.0.1 and the alert of infra/README.md posting to it, as typed there."""
    with webhook() as hook:
        command = ALERTS.replace("https://hooks.slack.com/services/T000/B000/XXXX", hook.url) + " --allow-private"
        installed = stack.run([sys.executable, *shlex.split(command)[1:]])
        assert installed.returncode == 0, installed.stdout + installed.stderr
        yield hook


def _alert(hook: Hook, stack: Stack, line: str) -> str:
    """The alert whose text has ``line``, once it came."""
    return hook.wait(line, why=lambda: stack.server_log.read_text()[-3000:])


# The crash test's deployment: heartbeats at Prefect's minimum (30 s), a run silent twice that
# long is Crashed, and its rerun follows 5 s later.
CRASHED_AFTER_S = 60


def _stuck(client, deployment: str) -> dict[str, tuple]:
    """Runs that send no heartbeat, set Running or Pending by hand, each with the state it was
    given: ``running``, of ``deployment`` (which vlcorpus deploy tagged as sending heartbeats),
    as a process that died between entering Running and its first heartbeat; ``elsewhere``, of
    the same flow outside any deployment (a served one, or a build against this server that
    sends none), Running; ``pending``, of ``deployment``, as a worker that took the run and died
    before it started its process; ``subflow``, a subflow run of build_corpus (which carries no
    tag) in ``running``, as a build killed while the run was starting."""
    from prefect.states import Pending, Running

    deployment_id = client.read_deployment_by_name(deployment).id
    running = client.create_flow_run_from_deployment(deployment_id)
    runs = {"running": (running, Running()),
            "elsewhere": (_elsewhere(client), Running()),
            "pending": (client.create_flow_run_from_deployment(deployment_id), Pending()),
            "subflow": (_subflow_run(client, running), Pending())}
    return {name: (run, client.set_flow_run_state(run.id, state, force=True).state)
            for name, (run, state) in runs.items()}


def _elsewhere(client):
    """A new run of rebuild_corpus from no deployment, as from a served one."""
    from prefect import flow

    @flow(name="rebuild_corpus")
    def elsewhere() -> None:
        """A stand-in: only its name goes to the server."""

    return client.create_flow_run(elsewhere)


def _subflow_run(client, parent):
    """A new subflow run of build_corpus in the run ``parent``."""
    from prefect import flow, task

    @flow(name="build_corpus")
    def subflow() -> None:
        """A stand-in: only its name goes to the server."""

    @task(name="build_corpus")
    def parent_task() -> None:
        """What stands for the subflow run in its parent's run."""

    in_parent = client.create_task_run(parent_task, flow_run_id=parent.id, dynamic_key="0")
    return client.create_flow_run(subflow, parent_task_run_id=in_parent.id)


def test_a_live_run_and_its_subflow_runs_marked_crashed_for_silence_go_back_to_running(stack):
    """flows/revive.py on the stack's server: a run and its subflow run, both marked
    Crashed by the liveness automation, are Running again; a run Crashed for another reason (its
    root taken over) stays Crashed."""
    import logging

    from prefect.states import Cancelled, Crashed

    from flows.liveness import Liveness
    from flows.revive import revive

    with _client() as client:
        running = _elsewhere(client)
        subflow, other = _subflow_run(client, running), _elsewhere(client)
        try:
            for run in (running, subflow):
                client.set_flow_run_state(run.id, Crashed(message=Liveness().message()), force=True)
            client.set_flow_run_state(other.id, Crashed(message="Crashed: its build's process died"), force=True)
            assert revive(running.id, logging.getLogger(__name__)) == [running.name, subflow.name]
            assert [client.read_flow_run(run.id).state.type.value for run in (running, subflow, other)] == \
                ["RUNNING", "RUNNING", "CRASHED"]
            assert revive(other.id, logging.getLogger(__name__)) == []
        finally:  # ended: the server's liveness watch of them too
            for run in (running, subflow, other):
                client.set_flow_run_state(run.id, Cancelled(), force=True)


@pytest.fixture
def own_liveness(stack):
    """For a test that deploys a liveness of its own: the server's one automation back to
    infra/prefect.yaml's window after it, which the stack's other tests run under (with this
    file's 60 s, a busy SQLite that held the server up for its 60 s busy timeout had the next
    test's live run marked Crashed)."""
    yield
    restored = stack.run(ONE_MACHINE[6])
    assert restored.returncode == 0, restored.stdout + restored.stderr


@pytest.mark.slow
def test_a_build_killed_with_its_worker_is_crashed_by_the_server_alerted_and_run_again(stack, own_liveness,
                                                                                        tmp_path):
    """Worker and flow process SIGKILLed mid-build: the server marks the run Crashed within its
    liveness window (no later run needed), the alert posts it once, and the deployment's rerun
    takes the root's lock over from the dead build and completes the build (up to align), with no
    command typed. A deployment's run that never sent a heartbeat, one that stayed Pending (its
    worker gone) and a subflow run that stayed Pending are Crashed within the same window, the
    deployment's alerted; a Running run of the flow from no deployment of vlcorpus deploy (which
    may send no heartbeat) is left alone."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterDeploymentId

    from flows.liveness import NAME as LIVENESS

    root = tmp_path / "crash"
    deployments = tmp_path / "nightly.yaml"
    deployments.write_text(yaml.safe_dump({
        "liveness": {"heartbeat_s": 30, "crashed_after_s": CRASHED_AFTER_S},
        "deployments": [{"name": "nightly-crash", "entrypoint": "flows.build.rebuild_corpus",
                         # Up to align: the stages after it are not what this tests.
                         "parameters": {"config": str(stack.config), "root": str(root), "until": "align"},
                         "rerun_crashed_after_s": 5, "work_pool": {"name": "vlcorpus"}},
                        # No worker polls its pool: its runs go Running or Pending by hand, below.
                        {"name": "silent-start", "entrypoint": "flows.build.rebuild_corpus",
                         "parameters": {"config": str(stack.config), "root": str(tmp_path / "silent")},
                         "work_pool": {"name": "no-worker"}}]}))
    deployed = stack.run(f"vlcorpus deploy --file {deployments}")
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    with _alert_hook(stack) as hook, _client() as client:
        # The silence the server watches for is this file's (its message says so too, below).
        (liveness,) = client.read_automations_by_name(LIVENESS)
        assert {t.within.total_seconds() for t in liveness.trigger.triggers} == {CRASHED_AFTER_S}
        started = stack.run("prefect deployment run rebuild_corpus/nightly-crash")
        dead = UUID(re.search(r"UUID: ([0-9a-f-]{36})", started.stdout).group(1))
        deadline = time.monotonic() + 300
        while not (root / "_lock.json").exists() or not _flow_processes(dead):
            assert time.monotonic() < deadline, stack.worker_log.read_text()[-4000:]
            time.sleep(0.5)
        time.sleep(2)  # the heartbeat the run sent as it started has reached the server
        # Watched in the same minutes as the killed build's.
        stuck = _stuck(client, "rebuild_corpus/silent-start")
        _kill_tree([stack.worker.pid, *_flow_processes(dead)])
        killed, killed_at = time.monotonic(), datetime.now(timezone.utc)
        stack.worker = stack.start_worker()

        # The figure printed below is the Crashed state's own time, not when the API answered: on a
        # busy machine the server's SQLite was once seen to hold its write lock for its whole 60 s
        # busy timeout (a burst of "database is locked" in its log), and the state, set on time,
        # was read a minute later.
        crashed = _wait_final(dead, stack, seconds=CRASHED_AFTER_S + 120, live=False)
        crashed_s = (crashed.state.timestamp - killed_at).total_seconds()
        assert crashed.state.type.value == "CRASHED", crashed.state
        # The server's liveness window crashed it (not the rerun, which says it took the lock over).
        assert f"sent no heartbeat for {CRASHED_AFTER_S} s" in crashed.state.message, crashed.state.message
        text = _alert(hook, stack, f"vlcorpus: {crashed.name} (nightly-crash) ended Crashed")
        alerted_s = time.monotonic() - killed
        assert "sent no heartbeat" in text, text

        def reruns() -> list:
            runs = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                deployment_id=FlowRunFilterDeploymentId(any_=[crashed.deployment_id])))
            return [run for run in runs if run.id != dead]

        deadline = time.monotonic() + 120
        while not reruns():
            assert time.monotonic() < deadline, stack.server_log.read_text()[-3000:]
            time.sleep(1)
        (rerun,) = reruns()
        done = _wait_final(rerun.id, stack)
        done_s = time.monotonic() - killed
        # The dead build's subflow runs sent heartbeats too: none is left Running.
        tree = _run_tree(client, dead)
        assert {run.state.type.value for run in tree} == {"CRASHED"}
        stuck_s = {}
        for name in ("running", "pending", "subflow"):
            run, went = stuck[name]
            try:
                run = _wait_final(run.id, stack, seconds=30, live=False)
            except AssertionError as exc:
                # Why a watch never fired is in the server's log: an event it gave up on after
                # its retries, each "database is locked" (as once on a busy machine).
                dropped = [line for line in stack.server_log.read_text().splitlines() if "dead letter" in line]
                raise AssertionError(f"{name}: {exc}\nevents the server dropped: {dropped}") from None
            assert run.state.type.value == "CRASHED", (name, run.state)
            assert f"sent no heartbeat for {CRASHED_AFTER_S} s" in run.state.message, (name, run.state.message)
            stuck_s[name] = (run.state.timestamp - went.timestamp).total_seconds()
            if name != "subflow":  # a subflow's death is its build's, alerted with the build
                assert "sent no heartbeat" in _alert(hook, stack, f"vlcorpus: {run.name} (silent-start) ended Crashed")
        # Long past the window by now.
        elsewhere = stuck["elsewhere"][0]
        assert client.read_flow_run(elsewhere.id).state.type.value == "RUNNING"
        # One alert for the dead build, none for its subflow runs.
        assert len(hook.with_line(f"vlcorpus: {crashed.name} (")) == 1, hook.texts
        assert not [text for text in hook.texts for run in tree[1:] if f"vlcorpus: {run.name} (" in text], hook.texts
        for run, _ in stuck.values():
            client.delete_flow_run(run.id)
        client.delete_deployment(crashed.deployment_id)
        client.delete_deployment(stuck["running"][0].deployment_id)
    _completed(done, stack)
    assert done.name == f"{crashed.name}-rerun" and done.parameters["rerun_of"] == str(crashed.id)
    messages = _logs_with(done.id, lambda m: "taking over the lock of flow run" in m and "its process is gone" in m)
    assert any("taking over the lock of flow run" in m and "its process is gone" in m for m in messages), messages
    print(f"crash: Crashed {crashed_s:.0f} s after the SIGKILL, alerted after {alerted_s:.0f} s, "
          f"its rerun completed after {done_s:.0f} s; Crashed after going Running with no heartbeat "
          f"{stuck_s['running']:.0f} s, after going Pending {stuck_s['pending']:.0f} s (a deployment's run) "
          f"and {stuck_s['subflow']:.0f} s (a subflow run)")
    checked = stack.run(f"vlcorpus validate {root}")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert stack.scheduler_errors() == []


@pytest.mark.slow
def test_an_unhealthy_build_ends_failed_and_the_alert_of_infra_readme_posts_it(stack, tmp_path):
    with _alert_hook(stack) as hook:
        config = tmp_path / "dead.yaml"
        config.write_text(yaml.safe_dump({"name": "dead", "sources": [{"type": "list", "path": "gone.txt"}]}))
        run_id = UUID(re.search(r"UUID: ([0-9a-f-]{36})", stack.run(
            ["prefect", "deployment", "run", "rebuild_corpus/rebuild", "-p", f"config={config}",
             "-p", f"root={tmp_path / 'root'}", "-p", "until=discover"]).stdout).group(1))
        run = _wait_final(run_id, stack)
        assert run.state.type.value == "FAILED", run.state
        assert run.state.message.startswith(f"The build of {tmp_path / 'root'} is unhealthy: the sources "
                                            f"listed 0 videos"), run.state.message
        assert "Unexpected result for failed state" not in stack.worker_log.read_text()
        text = _alert(hook, stack, f"vlcorpus: {run.name} (rebuild) ended Failed")
    assert "is unhealthy" in text, text
