"""A Hugging Face Hub that cannot be reached, and models put into a local Hub cache the way
`hf download` leaves them: for the tests of what a build finds on disk alone."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Hub:
    url: str
    connections: int = 0


@contextmanager
def unreachable_hub() -> Iterator[Hub]:
    """An endpoint on 127.0.0.1 that counts the connections it gets and drops each at once, so
    that a client that tries it fails quickly and the test sees that it tried."""
    server = socket.create_server(("127.0.0.1", 0))
    hub = Hub(f"http://127.0.0.1:{server.getsockname()[1]}")

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            hub.connections += 1
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.close()
        thread.join(timeout=5)


def hub_env(hf_home: Path, hub: Hub, **extra: str) -> dict[str, str]:
    """The environment of a process whose Hub is ``hub`` and whose cache is under ``hf_home``,
    with nothing that would keep it offline on its own."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")}
    return {**env, "HF_HOME": str(hf_home), "HF_ENDPOINT": hub.url, **extra}


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
