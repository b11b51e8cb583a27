"""A small production deployment on this machine, every part real and started the way
infra/README.md starts it on real machines, with the same commands and configs:

- PostgreSQL (Debian's ``postgresql``) as the Prefect server's database;
- ``prefect server start`` on it, requiring an API auth string of the stack's own, and
  ``prefect worker start --pool vlcorpus --type process``;
- ``dask scheduler`` and three ``dask worker`` processes, one with ``--resources GPU=1``, over
  TLS only, with certificates of the stack's own (``DIR/tls``, made as ``make secrets`` makes
  infra/tls/);
- an S3-compatible object store over HTTP (``moto_server``) behind ``infra/s3_faults.py``, a
  proxy that counts requests and bytes at the store and fails the ones it is told to fail.

    python infra/stack.py up [--dir .stack]   # start all; prints the environment to use it
    eval "$(python infra/stack.py env)"       # PREFECT_API_*, AWS_*, VLCORPUS_DASK_ADDRESS, DASK_*
    python infra/stack.py restart postgres    # or prefect-worker, dask-worker-cpu-1, ...
    python infra/stack.py down                # stop all of it

Each part runs in a session of its own (it outlives this script); ``DIR/stack.json`` (mode
0600: it holds the auth string) records them and ``DIR/logs/`` keeps their output. Every part
listens on 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import suppress
from dataclasses import asdict, dataclass, field
from pathlib import Path

from make_secrets import DASK, dask_env, make_tls

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
BUCKET = "vlcorpus"
DASK_WORKERS = [("dask-worker-cpu-1", []), ("dask-worker-cpu-2", []),
                ("dask-worker-gpu-1", ["--resources", "GPU=1"])]
# moto's server takes any credentials; these only have to be the same everywhere.
S3_KEY, S3_SECRET = "vlcorpus-stack", "vlcorpus-stack-secret"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Seconds a part may take to stop after SIGTERM before it is killed.
STOP_S = 20


def _wait(what: str, ready, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s")
        time.sleep(0.2)


def _answers(url: str) -> bool:
    with suppress(OSError), urllib.request.urlopen(url, timeout=2) as response:
        return response.status == 200
    return False


def _pg_bin(name: str) -> str:
    found = shutil.which(name) or next(iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                                                   reverse=True)), None)
    if found is None:
        raise RuntimeError(f"PostgreSQL's {name} not found: apt-get install -y postgresql")
    return found


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root: as root, run it as Debian's postgres user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@dataclass
class Stack:
    dir: str
    ports: dict[str, int] = field(default_factory=dict)
    pids: dict[str, int] = field(default_factory=dict)  # part -> pid of its session leader
    commands: dict[str, list[str]] = field(default_factory=dict)
    pgdata: str = ""
    auth: str = ""  # the Prefect server's API auth string

    # ---------------------------------------------------------------- where things are

    @property
    def state(self) -> Path:
        return Path(self.dir) / "stack.json"

    @classmethod
    def load(cls, directory: str) -> Stack:
        path = Path(directory) / "stack.json"
        if not path.exists():
            raise SystemExit(f"no stack in {directory}: start one with python infra/stack.py up --dir {directory}")
        return cls(**json.loads(path.read_text()))

    def save(self) -> None:
        with os.fdopen(os.open(self.state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
            out.write(json.dumps(asdict(self), indent=1) + "\n")

    @property
    def tls(self) -> Path:
        """The Dask cluster's certificates."""
        return Path(self.dir) / "tls"

    @property
    def database_url(self) -> str:
        return f"postgresql+asyncpg://vlcorpus@127.0.0.1:{self.ports['postgres']}/prefect"

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['prefect-server']}/api"

    @property
    def scheduler(self) -> str:
        return f"tls://127.0.0.1:{self.ports['dask-scheduler']}"

    @property
    def store_url(self) -> str:
        """The object store's endpoint as clients see it: the counting, fault-injecting proxy."""
        return f"http://127.0.0.1:{self.ports['s3-proxy']}"

    def env(self) -> dict[str, str]:
        """What a client of the stack sets: the same variables as on real machines."""
        return {
            "PREFECT_API_URL": self.api_url, "PREFECT_API_AUTH_STRING": self.auth,
            "VLCORPUS_DASK_ADDRESS": self.scheduler, **dask_env("client", self.tls),
            "VLCORPUS_ROOT": self.root("corpora"),
            "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": self.store_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        }

    def root(self, name: str) -> str:
        return f"s3://{BUCKET}/{name}"

    # ---------------------------------------------------------------- parts

    def _spawn(self, name: str, cmd: list[str]) -> None:
        logs = Path(self.dir) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as log:
            proc = subprocess.Popen(cmd, cwd=REPO, env={**os.environ, **self.env(), **self._part_env(name)},
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        self.pids[name], self.commands[name] = proc.pid, cmd
        self.save()

    def _pg_ctl(self, *args: str) -> None:
        log = Path(self.pgdata) / "server.log"
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "-D", self.pgdata, "-l", str(log), "-w",
                                     "-o", f"-h 127.0.0.1 -p {self.ports['postgres']} -k {self.pgdata}",
                                     *args]), check=True, stdout=subprocess.DEVNULL)

    def start_postgres(self) -> None:
        # Its own folder, which the postgres user can reach (DIR may sit in root's home).
        self.pgdata = tempfile.mkdtemp(prefix="vlcorpus-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.pgdata, "postgres", "postgres")
        subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", self.pgdata, "-U", "vlcorpus", "-A", "trust",
                                     "--no-sync"]), check=True, stdout=subprocess.DEVNULL)
        self.save()
        self._pg_ctl("start")
        subprocess.run([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(self.ports["postgres"]),
                        "-U", "vlcorpus", "prefect"], check=True)

    def start_store(self) -> None:
        self._spawn("s3", [str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(self.ports["s3"])])
        self._spawn("s3-proxy", [sys.executable, str(REPO / "infra" / "s3_faults.py"),
                                 "--port", str(self.ports["s3-proxy"]),
                                 "--upstream", f"http://127.0.0.1:{self.ports['s3']}"])
        _wait("the object store", lambda: _answers(f"{self.store_url}/__faults__"))
        import s3fs

        s3fs.S3FileSystem(endpoint_url=self.store_url, key=S3_KEY, secret=S3_SECRET).mkdir(BUCKET)

    def start_prefect_server(self) -> None:
        self._spawn("prefect-server", [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1",
                                       "--port", str(self.ports["prefect-server"]), "--no-ui"])
        _wait("the Prefect server", lambda: _answers(f"{self.api_url}/health"), timeout_s=180)

    def _part_env(self, name: str) -> dict[str, str]:
        """What a part sets beyond a client's environment: the server's, a Dask role's TLS."""
        if name == "prefect-server":
            return self._server_env()
        if name == "dask-scheduler":
            return dask_env("scheduler", self.tls)
        return dask_env("worker", self.tls) if name.startswith("dask-worker") else {}

    def _server_env(self) -> dict[str, str]:
        return {"PREFECT_SERVER_API_AUTH_STRING": self.auth,
                "PREFECT_API_DATABASE_CONNECTION_URL": self.database_url,
                "PREFECT_HOME": str(Path(self.dir) / "prefect"), "PREFECT_API_URL": "",
                # As infra/README.md sets it: runs that ended over 30 days ago are deleted.
                "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "events,flow_runs",
                "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD": "2592000"}

    def start_prefect_worker(self) -> None:
        self._spawn("prefect-worker", [str(BIN / "prefect"), "worker", "start", "--pool", "vlcorpus",
                                       "--type", "process"])

    def start_dask(self) -> None:
        make_tls(self.tls, shown_as=self.tls)
        # Its HTTP pages (worker logs among them), and a worker's (health, metrics), on 127.0.0.1
        # too: --host does not move them.
        self._spawn("dask-scheduler", [str(BIN / "dask"), "scheduler", "--protocol", "tls", "--host", "127.0.0.1",
                                       "--port", str(self.ports["dask-scheduler"]), "--no-dashboard",
                                       "--dashboard-address", "127.0.0.1:0"])
        for name, extra in DASK_WORKERS:
            self.start_dask_worker(name, extra)
        from distributed import Client
        from distributed.security import Security

        client_tls = dask_env("client", self.tls)
        security = Security(require_encryption=True, tls_ca_file=client_tls[f"{DASK}TLS__CA_FILE"],
                            tls_client_cert=client_tls[f"{DASK}TLS__CLIENT__CERT"],
                            tls_client_key=client_tls[f"{DASK}TLS__CLIENT__KEY"])
        with Client(self.scheduler, security=security, timeout=120) as client:
            client.wait_for_workers(len(DASK_WORKERS), timeout=120)

    def start_dask_worker(self, name: str, extra: list[str] | None = None) -> None:
        extra = extra if extra is not None else dict(DASK_WORKERS)[name]
        self._spawn(name, [str(BIN / "dask"), "worker", self.scheduler, "--name", name, "--nthreads", "1",
                           "--host", "127.0.0.1", "--no-dashboard", "--dashboard-address", "127.0.0.1:0", *extra])

    def up(self) -> None:
        Path(self.dir).mkdir(parents=True, exist_ok=True)
        self.auth = secrets.token_urlsafe(32)
        # Every address first: each part's environment names the others.
        self.ports = {name: free_port() for name in ("postgres", "s3", "s3-proxy", "prefect-server",
                                                      "dask-scheduler")}
        try:
            self.start_postgres()
            self.start_store()
            self.start_prefect_server()
            self.start_dask()
            self.start_prefect_worker()
        except BaseException:
            self.down()
            raise

    # ---------------------------------------------------------------- stopping

    def stop(self, name: str, sig: int = signal.SIGTERM, timeout_s: float = STOP_S) -> None:
        """Stop one part (its whole session: a dask worker's nanny and worker, a Prefect
        worker's flow runs)."""
        pid = self.pids.pop(name, None)
        self.save()
        if pid is not None:
            _stop_sessions([pid], sig, timeout_s)

    def restart(self, name: str) -> None:
        if name == "postgres":
            self._pg_ctl("-m", "fast", "restart")
            return
        cmd = self.commands[name]
        self.stop(name)
        self._spawn(name, cmd)

    def down(self) -> None:
        # Every part at once, so that their graceful stops (a Prefect worker waits for its flow
        # runs) overlap instead of adding up.
        pids = list(self.pids.values())
        self.pids.clear()
        self.save()
        _stop_sessions(pids, signal.SIGTERM, STOP_S)
        if self.pgdata and Path(self.pgdata).exists():
            with suppress(subprocess.CalledProcessError):
                self._pg_ctl("-m", "fast", "stop")
            shutil.rmtree(self.pgdata, ignore_errors=True)
        self.state.unlink(missing_ok=True)


def _stop_sessions(pids: list[int], sig: int, timeout_s: float) -> None:
    """Send ``sig`` to each process's session, wait up to ``timeout_s`` for them all, then
    SIGKILL what is left."""
    for pid in pids:
        with suppress(ProcessLookupError):
            os.killpg(pid, sig)
    deadline = time.monotonic() + timeout_s
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in pids:
        with suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with suppress(ChildProcessError):
        # Reap it when it is ours: a zombie answers kill(0) too.
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["up", "down", "env", "restart", "kill"])
    parser.add_argument("part", nargs="?", help="for restart and kill: postgres, prefect-server, "
                                                 "prefect-worker, dask-scheduler, dask-worker-cpu-1, ...")
    parser.add_argument("--dir", default=".stack", help="where the stack keeps its state and logs")
    args = parser.parse_args()
    if args.command == "up":
        stack = Stack(str(Path(args.dir).resolve()))
        stack.up()
        print("\n".join(f"export {k}={v}" for k, v in stack.env().items()))
        print(f"# corpus roots go under s3://{BUCKET}/ ; stop all with: python infra/stack.py down --dir {args.dir}",
              file=sys.stderr)
        return
    stack = Stack.load(args.dir)
    if args.command == "env":
        print("\n".join(f"export {k}={v}" for k, v in stack.env().items()))
    elif args.command == "down":
        stack.down()
    elif args.command == "restart":
        stack.restart(args.part)
    else:
        stack.stop(args.part, signal.SIGKILL, timeout_s=0)


if __name__ == "__main__":
    main()
