"""A name resolver for tests, in the process: host names under ``.test`` resolve to 127.0.0.1
(where tests/flakyserver.py serves) until told otherwise. It replaces ``socket.getaddrinfo``,
which every HTTP client yt-dlp uses goes through, so what fails is the real lookup of a real
request and the messages are yt-dlp's own.

- ``gone``: names that do not exist (EAI_NONAME, "Name or service not known"), as for a domain
  that has lapsed;
- an outage (``outage``): after a number of lookups, every name fails for some seconds
  (EAI_AGAIN, "Temporary failure in name resolution"), as when the resolver reaches no name
  server because the network is down; ``up()`` ends it.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

_real = socket.getaddrinfo


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
