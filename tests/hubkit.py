"""Stand-ins for the model hubs, on 127.0.0.1: one that cannot be reached, one that serves
models the way the Hugging Face Hub and torchvision's download server do; models put into a
local Hub cache the way `hf download` leaves them; and the pins (sha256) that let a test's
stand-in files pass for the published ones in a process the test starts."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    url: str
    connections: int = 0
    # "METHOD /path" -> how many times it was asked (the stand-in that serves models).
    requests: Counter[str] = field(default_factory=Counter)

    def downloads(self) -> int:
        """Files sent whole: GETs of a model file or of a weight file."""
        return sum(n for r, n in self.requests.items() if r.startswith("GET ") and "/api/" not in r)


@contextmanager
def unreachable_hub(silent: bool = False) -> Iterator[Hub]:
    """An endpoint on 127.0.0.1 that counts the connections it gets and drops each at once, so
    that a client that tries it fails quickly and the test sees that it tried; ``silent``: that
    holds each open and never answers (a firewall that swallows packets, as seen from a client)."""
    server = socket.create_server(("127.0.0.1", 0))
    hub = Hub(f"http://127.0.0.1:{server.getsockname()[1]}")
    held: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                for conn in held:
                    conn.close()
                return
            hub.connections += 1
            if silent:
                held.append(conn)
            else:
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept (closing alone does not, on Linux)
        server.close()
        thread.join(timeout=5)


@dataclass(frozen=True)
class _File:
    path: Path
    size: int
    sha256: str


def sha256(path: str | Path) -> str:
    """The sha256 of a file: what a test pins for its stand-in of a published file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _file(path: Path) -> _File:
    return _File(path, path.stat().st_size, sha256(path))


# `python -c _PINNED PINS MODULE ARGS...` runs MODULE as `python -m MODULE ARGS...` does, in a
# process whose pin table (pipeline/models/pins.py) also holds PINS (JSON, file name -> sha256).
_PINNED = """import json, runpy, sys
from pipeline.models.pins import SHA256
SHA256.update(json.loads(sys.argv.pop(1)))
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""


def pinned_command(pins: Mapping[str, str], module: str, *args: str, python: str = sys.executable) -> list[str]:
    """The command line of ``python -m module args`` in a process that takes ``pins`` (file name
    -> sha256) for the published files' own: the stand-ins a test serves or puts in a cache pass,
    while the production table stays as it is."""
    return [python, "-c", _PINNED, json.dumps(dict(pins)), module, *args]


@contextmanager
def stand_in_hub(models: Mapping[str, str | Path] = {}, files: Mapping[str, str | Path] = {},
                 gate: threading.Event | None = None) -> Iterator[Hub]:
    """A Hub on 127.0.0.1 serving ``models`` (repo id -> folder, at revision ``COMMIT`` as
    ``main``) through the endpoints huggingface_hub's ``snapshot_download`` calls (the revision's
    info, its file tree, ``resolve`` with the headers it reads), and plain ``files`` (URL path ->
    file) as a mirror of torchvision's download server does. Anything else is a 404. With a
    ``gate``, a file's body waits until the gate is set (a download that is still running)."""
    repos = {repo: {str(p.relative_to(folder)): _file(p) for p in sorted(Path(folder).rglob("*")) if p.is_file()}
             for repo, folder in models.items()}
    plain = {"/" + path.lstrip("/"): _file(Path(file)) for path, file in files.items()}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # quiet: the counts say what happened
            pass

        def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
            self._answer(body=False)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = self.path.split("?", 1)[0]
            hub.requests[f"{self.command} {path}"] += 1
            for repo, listing in repos.items():
                if path in (f"/api/models/{repo}/revision/main", f"/api/models/{repo}/revision/{COMMIT}"):
                    return self._json({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                       "siblings": [{"rfilename": name} for name in listing]}, body)
                if path.startswith(f"/api/models/{repo}/tree/"):
                    return self._json([{"type": "file", "path": name, "size": f.size, "oid": f.sha256[:40]}
                                       for name, f in listing.items()], body)
                for revision in ("main", COMMIT):
                    prefix = f"/{repo}/resolve/{revision}/"
                    if path.startswith(prefix) and path[len(prefix):] in listing:
                        return self._send(listing[path[len(prefix):]], body, {"X-Repo-Commit": COMMIT})
            if path in plain:
                return self._send(plain[path], body, {})
            self.send_error(404)

        def _json(self, obj: object, body: bool) -> None:
            data = json.dumps(obj).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _send(self, f: _File, body: bool, headers: dict[str, str]) -> None:
            self.send_response(200)
            for key, value in {**headers, "ETag": f'"{f.sha256}"', "Content-Length": str(f.size),
                               "Content-Type": "application/octet-stream"}.items():
                self.send_header(key, value)
            self.end_headers()
            if body and gate is not None:
                gate.wait(timeout=120)
            if body:
                with open(f.path, "rb") as src:
                    for block in iter(lambda: src.read(1 << 20), b""):
                        self.wfile.write(block)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def verify_request(self, request: object, client_address: object) -> bool:
            hub.connections += 1
            return True

    server = Server(("127.0.0.1", 0), Handler)
    hub = Hub(f"http://127.0.0.1:{server.server_address[1]}")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def hub_env(hf_home: Path, hub: Hub, **extra: str) -> dict[str, str]:
    """The environment of a process whose hubs are ``hub`` (Hugging Face's and the mirror of
    published weight files) and whose Hugging Face cache is under ``hf_home``, with nothing
    that would keep it offline on its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY", "VLCORPUS_OFFLINE")}
    return {**env, "HF_HOME": str(hf_home), "HF_ENDPOINT": hub.url, "VLCORPUS_WEIGHTS_MIRROR": hub.url, **extra}


def cache_model(hf_home: Path, repo_id: str, folder: str | Path) -> Path:
    """The files of ``folder`` as the main revision of ``repo_id`` in the cache under ``hf_home``
    (links, as the cache's own snapshots are links into its blobs)."""
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True, exist_ok=True)
    for entry in Path(folder).iterdir():
        (snapshot / entry.name).symlink_to(entry.resolve())
    return snapshot
