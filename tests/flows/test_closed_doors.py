"""The shipped cluster lets in no one who does not hold its secret (infra/README.md, Security).
The compose and Kubernetes files publish nothing beyond 127.0.0.1 and no Dask port, hold no
password, and turn Dask's TLS on wherever a Dask process runs; `make secrets` makes the secrets
once and prints none; a real Prefect server with an auth string refuses requests without it,
and `vlcorpus deploy` and `vlcorpus build` say so in one line; a real scheduler and workers
started as "On a Dask cluster" types them refuse a client without the cluster's certificate and
run a task for one with it; a build's local cluster listens on 127.0.0.1 only, over TLS with
certificates of its own where Dask's settings require encryption."""

from __future__ import annotations

import base64
import gc
import json
import operator
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from buildkit import Build, listening, speaks
from conftest import ROOT, tls_client, tls_env
from docskit import code_blocks, commands, shell
from infrakit import DASK_CLUSTER, INFRA, PREFECT_VALUES, by_kind, dask_pods, documents, lists_under
from sitekit import copy_site, held_site

sys.path.insert(0, str(ROOT / "infra"))
from make_secrets import ROLES, make_env_file, make_tls  # noqa: E402 - infra/ is a folder of scripts

BIN = Path(sys.executable).parent
DASK_TLS = "DASK_DISTRIBUTED__COMM__TLS__"
REQUIRE_ENCRYPTION = "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"
AUTH = "the-servers-auth-string"
WORKERS = 2


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> tuple[set[str], set[str]]:
    """What `make secrets` makes: the variables of infra/.env and the files of infra/tls/ (made
    here in a folder of the test's own)."""
    folder = tmp_path_factory.mktemp("secrets")
    make_env_file(folder / ".env")
    make_tls(folder / "tls")
    variables = {line.split("=", 1)[0] for line in (folder / ".env").read_text().splitlines()
                 if "=" in line and not line.startswith("#")}
    return variables, {path.name for path in (folder / "tls").iterdir()}


# ------------------------------------------------------------------ the shipped files


def test_compose_publishes_only_prefect_on_loopback_and_holds_no_secret(made):
    variables, files = made
    text = (INFRA / "docker-compose.yaml").read_text()
    (compose,) = documents(INFRA / "docker-compose.yaml")
    services = compose["services"]
    published = {name: service["ports"] for name, service in services.items() if "ports" in service}
    assert published == {"prefect-server": ["127.0.0.1:4200:4200"]}
    # Every secret is a variable of infra/.env, and compose refuses to start without it.
    passwords = re.findall(r"://\w+:(.+?)@", text)
    assert passwords == ["${POSTGRES_PASSWORD:?run make secrets}"], passwords
    for name in set(re.findall(r"\$\{(\w+)", text)):
        assert name in variables and f"${{{name}:?run make secrets}}" in text, name
    for name, service in services.items():
        for key, value in service.get("environment", {}).items():
            if "PASSWORD" in key or "AUTH_STRING" in key:
                assert value == f"${{{key}:?run make secrets}}", (name, key)
    assert set(compose["secrets"]) == {f"dask-{name}" for name in ["ca", *(f"{role}-{part}" for role in ROLES
                                                                          for part in ("cert", "key"))]}
    assert {spec["file"].removeprefix("./tls/") for spec in compose["secrets"].values()} <= files
    # Dask: TLS only wherever a process of it runs, each with its role's mounted files.
    dask = set()
    for name, service in services.items():
        env, command = service.get("environment", {}), service.get("command", [])
        dask_like = command[:1] == ["dask"] or any(key.startswith("DASK_") or "DASK_ADDRESS" in key for key in env)
        if not dask_like:
            continue
        dask.add(name)
        assert env[REQUIRE_ENCRYPTION] == "True", name
        assert all(value.startswith("tls://") for value in command + list(env.values()) if "://" in value
                   and not value.startswith("http")), name
        for key, value in env.items():
            if key.startswith(DASK_TLS):
                assert value.removeprefix("/run/secrets/") in service["secrets"], (name, key)
    assert dask >= {"prefect-worker", "dask-scheduler", "dask-worker-cpu", "dask-worker-gpu"}, dask
    scheduler = services["dask-scheduler"]["command"]
    assert "--protocol" in scheduler and scheduler[scheduler.index("--protocol") + 1] == "tls"
    (cmd,) = [line for line in (INFRA / "docker" / "Dockerfile").read_text().splitlines() if line.startswith("CMD ")]
    image_default = yaml.safe_load(cmd[4:])
    assert image_default[2].startswith("tls://")
    # Dask's HTTP pages (the scheduler's show its workers' logs) on each container's loopback.
    for command in [image_default, *(s["command"] for s in services.values() if s.get("command", [""])[0] == "dask")]:
        assert command[command.index("--dashboard-address") + 1].startswith("127.0.0.1:"), command


def _secret_refs(node) -> list[tuple[str, str]]:
    """(Secret, key) of every secretKeyRef and of every item of a mounted Secret."""
    if isinstance(node, list):
        return [ref for value in node for ref in _secret_refs(value)]
    if not isinstance(node, dict):
        return []
    if "secretKeyRef" in node:
        return [(node["secretKeyRef"]["name"], node["secretKeyRef"]["key"])]
    if "secretName" in node:
        return [(node["secretName"], item["key"]) for item in node.get("items", [])]
    return [ref for value in node.values() for ref in _secret_refs(value)]


def test_kubernetes_keeps_dask_inside_on_tls_and_takes_secrets_from_secrets(made):
    variables, files = made
    docs = {path: documents(path) for path in (DASK_CLUSTER, PREFECT_VALUES)}
    for path in docs:
        assert not re.search(r"LoadBalancer|NodePort|hostPort|hostNetwork", path.read_text()), path
    cluster = by_kind(DASK_CLUSTER)["DaskCluster"]["spec"]
    assert cluster["scheduler"]["service"]["type"] == "ClusterIP"
    pods = dask_pods()
    scheduler = pods["scheduler"]["containers"][0]["args"]
    assert scheduler[scheduler.index("--protocol") + 1] == "tls"
    for group in ("cpu", "gpu"):
        worker = pods[group]["containers"][0]["args"]
        assert worker[worker.index("--dashboard-address") + 1] == "127.0.0.1:0"
    (values,) = docs[PREFECT_VALUES]
    envs = [env for doc in docs.values() for body in doc for env in lists_under(body, ("env", "extraEnvVars"))]
    assert len(envs) == 5  # the scheduler, two worker groups, the Prefect worker and its deploy
    for env in envs:
        by_name = {item["name"]: item for item in env}
        if any(name.startswith("DASK_") or "DASK_ADDRESS" in name for name in by_name):
            assert by_name[REQUIRE_ENCRYPTION]["value"] == "True", sorted(by_name)
        for name, item in by_name.items():
            if "AUTH_STRING" in name or "PASSWORD" in name:
                assert "value" not in item and "secretKeyRef" in item["valueFrom"], name
            if "DASK" in name and "://" in item.get("value", ""):
                assert item["value"].startswith("tls://"), name
    # The chart reads the worker's auth string from a Secret too, not from its values.
    basic = values["worker"]["selfHostedServerApiConfig"]["basicAuth"]
    assert basic["existingSecret"] == "vlcorpus-prefect" and "authString" not in basic
    # The Secrets' keys are what infra/README.md's `kubectl create secret generic ...
    # --from-file=infra/tls/` makes of the files of `make secrets`, and the auth string that
    # its vlcorpus-prefect takes from infra/.env.
    refs = {ref for doc in docs.values() for body in doc for ref in _secret_refs(body)}
    assert {key for secret, key in refs if secret == "vlcorpus-prefect"} == {"auth-string"}
    assert "PREFECT_API_AUTH_STRING" in variables
    assert {key for secret, key in refs if secret == "vlcorpus-dask-tls"} <= files
    readme = " ".join((INFRA / "README.md").read_text().split())
    assert "kubectl create secret generic vlcorpus-prefect --from-env-file=<(sed -n " \
           "'s/^PREFECT_API_AUTH_STRING=/auth-string=/p' infra/.env)" in readme
    assert "kubectl create secret generic vlcorpus-dask-tls --from-file=infra/tls/" in readme


def test_make_secrets_makes_them_once_and_prints_none():
    """`make secrets` as infra/README.md types it, in the repository (git ignores what it makes)."""
    first = subprocess.run(["make", "secrets"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    made = {path: path.read_bytes() for path in [INFRA / ".env", *(INFRA / "tls").iterdir()]}
    assert (INFRA / ".env").stat().st_mode & 0o777 == 0o600
    assert (INFRA / "tls").stat().st_mode & 0o077 == 0
    assert {path.stat().st_mode & 0o777 for path in (INFRA / "tls").glob("*-key.pem")} == {0o600}
    again = subprocess.run(["make", "secrets"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "kept" in again.stdout, again.stdout + again.stderr
    assert {path: path.read_bytes() for path in made} == made
    values = [line.split("=", 1)[1] for line in made[INFRA / ".env"].decode().splitlines()
              if "=" in line and not line.startswith("#")]
    assert values, "infra/.env holds no secret"
    for printed in (first.stdout + first.stderr, again.stdout + again.stderr):
        assert not [value for value in values if value in printed]
    ignored = subprocess.run(["git", "check-ignore", "infra/.env", "infra/tls/ca.pem"], cwd=ROOT,
                             capture_output=True, text=True)
    assert ignored.stdout.split() == ["infra/.env", "infra/tls/ca.pem"]


# ------------------------------------------------------------------ a real Prefect server


@pytest.fixture(scope="module")
def auth_server():
    """A Prefect server (the project's temporary one: Prefect's app under uvicorn) started
    with an auth string."""
    from flows.services import start_server

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_SERVER_API_AUTH_STRING", AUTH)
        patch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        server = start_server()
    try:
        yield server.api_url
    finally:
        server.stop()


@contextmanager
def _client_of(url: str, auth: str | None):
    """This process's Prefect settings: the server at ``url``, sending ``auth``."""
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: url, PREFECT_API_AUTH_STRING: auth}):
        yield


def _status(url: str, auth: str | None = None, method: str = "GET", body: bytes | None = None) -> int:
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(auth.encode()).decode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, body, headers, method=method), timeout=30) as reply:
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_the_prefect_api_refuses_a_request_without_its_auth_string(auth_server):
    from flows.api_access import refusal
    from flows.deploy import DeployError, check_server
    from flows.services import prefect_server
    from pipeline.errors import SetupError

    runs = f"{auth_server}/flow_runs/filter"
    assert _status(runs, method="POST", body=b"{}") == 401
    assert _status(runs, "not-the-string", method="POST", body=b"{}") == 401
    assert _status(runs, AUTH, method="POST", body=b"{}") == 200
    assert _status(f"{auth_server}/health") == 200  # healthchecks need none
    for sent, said in [(None, "sent no PREFECT_API_AUTH_STRING"),
                       ("not-the-string", "sent a PREFECT_API_AUTH_STRING it does not accept")]:
        with _client_of(auth_server, sent):
            line = refusal(auth_server)
            assert line.startswith(f"the Prefect server at {auth_server} requires its API auth string")
            assert said in line and "\n" not in line and "not-the-string" not in line
            with pytest.raises(DeployError, match=re.escape(line)):
                check_server()
            with pytest.raises(SetupError, match=re.escape(line)), prefect_server():
                pass
    with _client_of(auth_server, AUTH):
        assert refusal(auth_server) is None and check_server() == auth_server


# ------------------------------------------------------------------ a real Dask cluster


def _cluster_block() -> list[str]:
    """The commands of infra/README.md's "On a Dask cluster" block."""
    (block,) = [b for b in code_blocks(INFRA / "README.md") if "dask scheduler" in b.text]
    return commands(block)


def test_a_dask_client_without_the_clusters_certificate_cannot_connect(tmp_path):
    from distributed import Client
    from distributed.security import Security

    from flows.clusters import scheduler_workers

    (make, scheduler_tls, scheduler, worker_tls, cpu_worker, gpu_worker, client_tls, _run) = _cluster_block()
    assert make == "make secrets" and "dask_address=tls://HOST:8786" in _run
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    shell([make], env)
    scheduler_file = tmp_path / "scheduler.json"
    # As typed, on a port of its own on 127.0.0.1.
    started = [f"{scheduler_tls} && exec {scheduler} --host 127.0.0.1 --port 0 --scheduler-file {scheduler_file}"]
    procs = [subprocess.Popen(["bash", "-c", started[0]], cwd=ROOT, env=env, start_new_session=True)]
    try:
        _wait_for(scheduler_file, procs[0])
        address = json.loads(scheduler_file.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:")
        for line in (cpu_worker, gpu_worker):
            typed = line.replace("tls://HOST:8786", address)
            procs.append(subprocess.Popen(["bash", "-c", f"{worker_tls} && exec {typed} --host 127.0.0.1"],
                                          cwd=ROOT, env=env, start_new_session=True))
        # The client's settings, as client.env gives them (paths from the repository's root).
        settings = {k: v for k, v in shell([client_tls], {"PATH": os.environ["PATH"]}).items() if k.startswith("DASK_")}
        assert settings == {k: os.path.relpath(v, ROOT) if k.startswith(DASK_TLS) else v
                            for k, v in tls_env("client").items()}
        with Client(address, security=tls_client(), timeout=30) as client:
            client.wait_for_workers(2, timeout=60)
            assert client.submit(operator.add, 40, 2, pure=False).result(timeout=30) == 42
            workers = scheduler_workers(client)
            assert len(workers) == 2 and all(worker.startswith("tls://127.0.0.1:") for worker in workers), workers
        # No certificate; a certificate of another CA; plain TCP: each refused.
        for address_tried, security in [(address, None), (address, Security.temporary()),
                                        (address.replace("tls://", "tcp://"), None)]:
            with pytest.raises((OSError, TypeError)):
                # Not the default: a client that fails to start would leave itself as the
                # session's scheduler in Dask's global settings.
                Client(address_tried, security=security, timeout=3, set_as_default=False)
            # The failed client, held in a reference cycle by its traceback, closes now: closed
            # by the garbage collector inside the next client's start, it waits for ever on the
            # lock that start holds (distributed's LoopRunner).
            gc.collect()
        assert _loopback_only([proc.pid for proc in procs])
    finally:
        for proc in procs:
            os.killpg(proc.pid, 15)
        for proc in procs:
            proc.wait(timeout=30)


def _wait_for(path: Path, proc: subprocess.Popen, seconds: float = 60) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, f"no {path.name}"
        time.sleep(0.1)


def _loopback_only(pids: list[int]) -> bool:
    """Whether every socket the processes (and theirs) listen on is on 127.0.0.1."""
    listening_ips = [ip for pid in pids for addresses in listening(pid).values() for ip, _ in addresses]
    return bool(listening_ips) and set(listening_ips) == {"127.0.0.1"}


# ------------------------------------------------------------------ a build's local cluster


@pytest.mark.slow
def test_a_builds_local_cluster_listens_on_loopback_over_tls_where_required(demo_corpus, tmp_path):
    """`vlcorpus build` as typed on a host whose Dask settings require encryption (client.env
    taken, as on a TLS cluster's client), looked into while its workers' downloads wait on the
    site: every socket its processes listen on is on 127.0.0.1; the scheduler's, the nannies'
    and the workers' speak TLS, with certificates of the build's own (the cluster CA signs none
    of them), and the rest are HTTP pages (Dask's, the temporary Prefect server's). A build
    without those settings listens on loopback too (tests/flows/test_flow.py)."""
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"}
    shell(["make secrets"], env)
    env.update(tls_env("client"))
    site = copy_site(demo_corpus, tmp_path)
    config = tmp_path / "doors.yaml"
    config.write_text(yaml.safe_dump({
        "name": "doors", "root": str(tmp_path / "corpus"), "sources": [{"type": "list", "path": "site/urls.txt"}],
        "download": {"subtitle_langs": ["en"], "rate_limit": None, "per_host": None},
        "execution": {"n_workers": WORKERS, "retry_backoff_s": 0}}))
    with held_site(site) as served:
        served.hold()
        running = Build.start(str(config), "--until", "download", env=env, folder=tmp_path)
        served.wait_for_download(running.process)
        found = listening(running.process.pid)
        spoken = {(process.pid, port): speaks(port) for process, addresses in found.items() for _, port in addresses}
        signed_by_ca = [port for (_, port), said in spoken.items()
                        if said == "tls" and speaks(port, env[f"{DASK_TLS}CA_FILE"]) == "tls"]
        served.release()
        done = running.finish()
    assert done.returncode == 0, done.stderr[-3000:]
    assert {ip for addresses in found.values() for ip, _ in addresses} == {"127.0.0.1"}
    assert set(spoken.values()) == {"http", "tls"}, spoken
    over_tls = [pid for (pid, _), said in spoken.items() if said == "tls"]
    # The scheduler, each nanny and each worker, the workers in processes of their own.
    assert len(over_tls) >= 1 + 2 * WORKERS
    assert len(set(over_tls) - {running.process.pid}) >= WORKERS
    assert signed_by_ca == []
    assert "download: 1/1 partitions, 2 done, 2 failed" in done.stderr
