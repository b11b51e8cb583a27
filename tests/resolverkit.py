"""A name resolver for tests: host names under ``.test`` resolve to 127.0.0.1 (where
tests/flakyserver.py serves) until told otherwise, and so do the real names a test serves
itself (``hosts``: www.youtube.com, to tests/youtubekit.py's server), to its port. It replaces
``socket.getaddrinfo``, which every HTTP client yt-dlp uses goes through, so what fails is the
real lookup of a real request and the messages are yt-dlp's own.

- ``gone``: names that do not exist (EAI_NONAME, "Name or service not known"), as for a domain
  that has lapsed;
- an outage: every name fails (EAI_AGAIN, "Temporary failure in name resolution"), as when the
  resolver reaches no name server because the network is down.

``resolver()`` serves this process, with an outage after a number of lookups. ``shared()``
serves a build's worker processes too: its state is a file the test rewrites (``down()``,
``up()``), read at each lookup by every process started with ``resolver_site/`` on PYTHONPATH
(its sitecustomize installs it). A site served over TLS has a certificate of a test CA, which
``shared(trust=...)`` adds to what yt-dlp trusts in those processes (``trust``).
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
TRUST_ENV = "VLCORPUS_TEST_CA_BUNDLE"
SITE = Path(__file__).parent / "resolver_site"


@dataclass
class Resolver:
    gone: set[str] = field(default_factory=set)
    hosts: dict[str, int] = field(default_factory=dict)  # real names served on 127.0.0.1: port
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

    def _served(self) -> dict[str, int]:
        return self.hosts

    def getaddrinfo(self, host, port, *args, **kwargs):  # socket.getaddrinfo's signature
        name = (host.decode() if isinstance(host, bytes) else host) or ""
        served = self._served().get(name)
        if served is None and not name.endswith(".test"):
            return _real(host, port, *args, **kwargs)
        if self._down():
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        if name in self.gone:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return _real("127.0.0.1", served or port, *args, **kwargs)


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
    """The resolver whose outage and served names are a state file: {"down": bool, "hosts":
    {name: port}}."""

    path: str = ""

    def _state(self) -> dict:
        return json.loads(Path(self.path).read_text())

    def _down(self) -> bool:
        return self._state()["down"]

    def _served(self) -> dict[str, int]:
        return self._state().get("hosts", {})

    def down(self, value: bool = True) -> None:
        Path(self.path).write_text(json.dumps({"down": value, "hosts": self.hosts}))

    def up(self) -> None:
        self.down(False)


def install(path: str) -> None:
    """Resolve through the state file at ``path`` in this process."""
    socket.getaddrinfo = FileResolver(path=path).getaddrinfo


def trust(bundle: str) -> None:
    """yt-dlp in this process trusts the certificates of ``bundle`` (certifi's, with a test
    CA's added): it verifies a site against certifi's bundle, as the machine's trust store."""
    import certifi

    certifi.where = lambda: bundle


@contextmanager
def shared(path: Path, monkeypatch: pytest.MonkeyPatch, hosts: dict[str, int] | None = None,
           trusted: str | None = None) -> Iterator[FileResolver]:
    """The resolver of this process and of every process it starts from now on; ``hosts``:
    real names served on 127.0.0.1 at those ports; ``trusted``: a CA bundle those processes'
    yt-dlp trusts (``trust``)."""
    control = FileResolver(path=str(path), hosts=dict(hosts or {}))
    control.down(False)
    monkeypatch.setenv(STATE_ENV, str(path))
    if trusted is not None:
        monkeypatch.setenv(TRUST_ENV, trusted)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(SITE), os.environ.get("PYTHONPATH")])))
    socket.getaddrinfo = control.getaddrinfo
    try:
        yield control
    finally:
        socket.getaddrinfo = _real
