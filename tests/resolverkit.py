"""A name resolver for tests: host names under ``.test`` resolve to 127.0.0.1 (where
tests/flakyserver.py serves) until told otherwise. It replaces ``socket.getaddrinfo``, which
every HTTP client yt-dlp uses goes through, so what fails is the real lookup of a real request
and the messages are yt-dlp's own.

- ``gone``: names that do not exist (EAI_NONAME, "Name or service not known"), as for a domain
  that has lapsed;
- an outage: every name fails (EAI_AGAIN, "Temporary failure in name resolution"), as when the
  resolver reaches no name server because the network is down.

``resolver()`` serves this process, with an outage after a number of lookups. ``shared()``
serves a build's worker processes too: its state is a file the test rewrites (``down()``,
``up()``), read at each lookup by every process started with ``resolver_site/`` on PYTHONPATH
(its sitecustomize installs it).
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # worker processes import this module: no pytest there
    import pytest

_real = socket.getaddrinfo
STATE_ENV = "VLCORPUS_TEST_RESOLVER"
SITE = Path(__file__).parent / "resolver_site"


@dataclass
class Resolver:
    gone: set[str] = field(default_factory=set)
    down_after: int | None = None  # lookups before the outage begins
    down_for: float = math.inf  # seconds it lasts from its first failed lookup
    lookups: int = 0
    failed: int = 0  # lookups that failed because of the outage
    down_since: float | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def outage(self, after: int, seconds: float = math.inf) -> None:
        self.down_after, self.down_for, self.down_since = self.lookups + after, seconds, None

    def up(self) -> None:
        self.down_after = None

    def _down(self) -> bool:
        with self.lock:
            self.lookups += 1
            if self.down_after is None or self.lookups <= self.down_after:
                return False
            self.down_since = self.down_since or time.monotonic()
            down = time.monotonic() - self.down_since < self.down_for
            self.failed += down
            return down

    def getaddrinfo(self, host, port, *args, **kwargs):  # socket.getaddrinfo's signature
        name = host.decode() if isinstance(host, bytes) else host
        if not (name or "").endswith(".test"):
            return _real(host, port, *args, **kwargs)
        if self._down():
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if name in self.gone:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return _real("127.0.0.1", port, *args, **kwargs)


@contextmanager
def resolver(gone: set[str] | None = None) -> Iterator[Resolver]:
    fake = Resolver(gone=set(gone or ()))
    socket.getaddrinfo = fake.getaddrinfo
    try:
        yield fake
    finally:
        socket.getaddrinfo = _real


@dataclass
class FileResolver(Resolver):
    """The resolver whose outage is a state file: {"down": bool}."""

    path: str = ""

    def _down(self) -> bool:
        return json.loads(Path(self.path).read_text())["down"]

    def down(self, value: bool = True) -> None:
        Path(self.path).write_text(json.dumps({"down": value}))

    def up(self) -> None:
        self.down(False)


def install(path: str) -> None:
    """Resolve through the state file at ``path`` in this process."""
    socket.getaddrinfo = FileResolver(path=path).getaddrinfo


@contextmanager
def shared(path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FileResolver]:
    """The resolver of this process and of every process it starts from now on."""
    control = FileResolver(path=str(path))
    control.down(False)
    monkeypatch.setenv(STATE_ENV, str(path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")])))
    socket.getaddrinfo = control.getaddrinfo
    try:
        yield control
    finally:
        socket.getaddrinfo = _real
