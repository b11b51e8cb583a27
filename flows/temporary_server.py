"""Prefect's temporary local server as a child process, started without importing Prefect.

Its start is the longest part of a small build's set-up (importing the server is about 2.5
CPU-s), so ``vlcorpus build`` starts it as soon as the config holds, before it checks the stages
and imports Prefect to find out whether a server is configured
(``flows.services.prefect_server`` stops it again if one is).

Each server has a database of its own, deleted when it stops: a copy of an empty one that the
first server of this Prefect version migrated (migrating takes about 7 s). Prefect's own
temporary server keeps every run in ``~/.prefect/prefect.db`` for ever; that file grew by
megabytes a build, and each start of the server slowed with it.

The database lives in a temporary folder that the server's stop deletes. A build killed outright
(SIGKILL) runs no exit handler, and its folder stays: the folder is named after the process that
made it (its pid, its start time and its host), and each server's start deletes the folders
whose process is gone, never one of a live build (a pid that now names another process, started
later, is gone too)."""

from __future__ import annotations

import atexit
import importlib.metadata
import os
import secrets
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import zlib
from contextlib import closing, suppress
from pathlib import Path

import psutil

from pipeline.gc_pause import collector_paused

FOLDER_PREFIX = "vlcorpus-prefect-"
# Seconds the temporary server may take to come up: Prefect's default (20) fails builds on a
# busy machine, where importing the server and migrating its database take longer.
SERVER_STARTUP_S = 120


# The services of an ephemeral server that only keep history: the task runs (recorded from
# the clients' events), the events themselves, automations and the event stream for the UI. A
# build's own server is deleted with the build, so nothing ever reads what they would write; it
# keeps the API (flow runs, their states, logs) that the build runs on.
NO_HISTORY = {"PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED": "false",
              "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
              "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
              "PREFECT_API_EVENTS_STREAM_OUT_ENABLED": "false"}


LOOPBACK = "127.0.0.1"


class TemporaryServer:
    """Prefect's temporary local server, run the way Prefect runs it (uvicorn on the server's
    app factory, ephemeral mode, no UI; see ``_serve``). ``wait()`` returns once it answers its
    health check. ``history``: it records task runs and events, for a caller that reads them
    back (a build's own server does not). ``host``: where it listens, loopback by default; on
    another address (for workers on other machines: SLURM jobs) it asks every client for an
    auth string of its own (``auth``), which nothing else knows."""

    def __init__(self, port: int | None = None, *, history: bool = False, host: str = LOOPBACK) -> None:
        # Without a port, the server takes the socket this process bound to a free one (port
        # 0): no other process can take that port between its choice and the server's start.
        listener = None
        if not port:
            listener = socket.socket()
            listener.bind((host, 0))
            port = listener.getsockname()[1]
        self.port = port
        self.up = False
        self.api_url = f"http://{host}:{self.port}/api"
        self.auth = None if host == LOOPBACK else f"vlcorpus:{secrets.token_urlsafe(32)}"
        self.folder = tempfile.mkdtemp(prefix=_owned_prefix())
        self.database, self.from_template = _database(self.folder)
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
               "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{self.database}",
               "PREFECT__SERVER_FINAL": "1",
               # Registering block types (and hashing them to see if they changed) imports
               # every installed Prefect collection: 0.6 s of the server's start. Builds use
               # no blocks.
               "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
               "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
               # The server would otherwise try to reach Prefect's telemetry endpoint.
               "PREFECT_SERVER_ANALYTICS_ENABLED": os.environ.get("PREFECT_SERVER_ANALYTICS_ENABLED", "false"),
               # A copy of the template is migrated already: checking it again loads every
               # migration script, a sixth of the server's start (0.5 of 3 CPU-s). A new
               # database is migrated whatever the environment says, or no template would work.
               "PREFECT_API_DATABASE_MIGRATE_ON_START": "false" if self.from_template else "true",
               **({"PREFECT_SERVER_API_AUTH_STRING": self.auth} if self.auth else {}),
               **({} if history else NO_HISTORY)}
        # -P: nothing in the current folder shadows a module of the server's.
        where = f"{host}:{self.port}" if listener is None else f"fd:{listener.fileno()}"
        try:
            self.process = subprocess.Popen([sys.executable, "-P", "-m", "flows.temporary_server", where],
                                            env=env, pass_fds=() if listener is None else (listener.fileno(),))
        finally:
            if listener is not None:
                listener.close()  # the server's copy stays open
        # A server this process started never outlives it, whatever path the process exits by.
        atexit.register(self.stop)
        remove_orphans()  # while the server imports

    def wait(self, timeout_s: float = SERVER_STARTUP_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            # OSError: not listening yet; look again below, unless it died or took too long.
            with suppress(OSError), \
                    urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                if response.status == 200:
                    self.up = True
                    if not self.from_template:
                        _keep_template(self.database)
                    return
            if self.process.poll() is not None:
                if self.from_template:  # a bad template must not fail every build after this one
                    _template().unlink(missing_ok=True)
                raise RuntimeError(f"Prefect's temporary server exited with code {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"Prefect's temporary server did not answer within {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            if self.up:
                self.process.terminate()
                try:
                    self.process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.process.kill()
            else:  # still importing, which a SIGTERM waits out (2 s): nothing to close yet
                self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _host_key() -> str:
    """This host, in a folder name (a /tmp shared with a container must not take the
    container's processes for gone)."""
    return f"{zlib.crc32(socket.gethostname().encode()):08x}"


def _started(process: psutil.Process) -> int:
    """When ``process`` started, in hundredths of a second since the epoch (its resolution)."""
    return round(process.create_time() * 100)


def _owned_prefix() -> str:
    """The name of this process's server folders, up to mkdtemp's random part."""
    me = psutil.Process()
    return f"{FOLDER_PREFIX}{me.pid}-{_started(me)}-{_host_key()}-"


def _owner_gone(name: str) -> bool:
    """Whether the process named in the folder name ``name`` is gone. A name of another form (an
    older build's) or of another host says nothing: its folder is kept."""
    pid, started, host, *_ = name.removeprefix(FOLDER_PREFIX).split("-") + ["", "", ""]
    if not (pid.isdigit() and started.isdigit()) or host != _host_key():
        return False
    try:
        return abs(_started(psutil.Process(int(pid))) - int(started)) > 1
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # another user's process, alive
        return False


def remove_orphans() -> None:
    """Delete the server folders of the builds on this host whose process is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}*"):
        if folder.is_dir() and _owner_gone(folder.name):
            shutil.rmtree(folder, ignore_errors=True)


def server_unless_configured(host: str = LOOPBACK) -> TemporaryServer | None:
    """A temporary server for a build, listening on ``host``, started now; none when
    ``PREFECT_API_URL`` is in the environment (a Prefect worker's flow runs, a configured
    shell). A profile can name a server too, which only Prefect's settings tell:
    ``flows.services.prefect_server`` stops it then."""
    return None if os.environ.get("PREFECT_API_URL") else TemporaryServer(host=host)


def _template() -> Path:
    """The migrated empty database of this Prefect version, beside Prefect's own."""
    home = Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()
    return home / f"vlcorpus-empty-{importlib.metadata.version('prefect')}.db"


def _database(folder: str) -> tuple[str, bool]:
    """A server's database in ``folder``: a copy of the template when there is one (and
    whether it is)."""
    path = os.path.join(folder, "prefect.db")
    with suppress(FileNotFoundError):
        shutil.copyfile(_template(), path)
        return path, True
    return path, False


def _keep_template(database: str) -> None:
    """A consistent copy of a database the server has just migrated, as the template (SQLite's
    backup reads it while the server has it open)."""
    template = _template()
    template.parent.mkdir(parents=True, exist_ok=True)
    part = template.with_suffix(f".{os.getpid()}.part")
    with closing(sqlite3.connect(database)) as source, closing(sqlite3.connect(part)) as copy:
        source.backup(copy)
    os.replace(part, template)


def _app() -> object:
    """Prefect's server app, its imports and making with the garbage collector paused
    (pipeline/gc_pause.py: its passes were a fifth of the server's start, 0.7 of 3.3 CPU-s)."""
    with collector_paused():
        from prefect.server.api.server import create_app

        return create_app()


def _serve(where: str) -> None:
    """Serve on ``where``: ``host:port``, or ``fd:N``, a socket bound for this process by its
    parent."""
    threading.Thread(target=_stop_with_parent, args=(os.getppid(),), daemon=True).start()
    with collector_paused():
        import uvicorn

    if where.startswith("fd:"):
        # uvicorn's fd= path, whose socket.fromfd takes the family from the descriptor (TCP).
        address = {"fd": int(where[3:])}
    else:
        host, _, port = where.rpartition(":")
        address = {"host": host, "port": int(port)}
    uvicorn.run(_app, factory=True, log_level="error", lifespan="on", **address)


def _stop_with_parent(parent: int) -> None:
    """A build killed outright (SIGKILL, SIGTERM) runs no exit handler: its server then stops
    itself, as Prefect's own temporary server does not."""
    while os.getppid() == parent:
        time.sleep(1)
    os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    _serve(sys.argv[1])
