"""One build at a time per corpus root: a lock file under the root that its holder keeps fresh.

The lock is ``<root>/_lock.json``, created with fsspec's exclusive mode ``"xb"`` (``O_EXCL`` on
a local disk, a conditional put on object stores that offer one). Its holder rewrites the
heartbeat every ``heartbeat_s`` seconds. A lock is stale, and taken over, when its heartbeat is
older than ``stale_s`` or when its holder ran on this host and its process is gone, so a run
that crashed or was killed cannot hold a root forever; whoever takes a lock over is told whose
it was (``on_takeover``), so that a Prefect run that died with it can be marked Crashed. The
stale record is read again just before it is removed, so that of two runs taking over the same
lock the later one sees the new holder; only two that read, check and remove within the same
few milliseconds could both proceed.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass

import fsspec

from pipeline.progress import log as default_log

LOCK_FILE = "_lock.json"
# Four missed heartbeats: a build killed on another machine is taken over within a minute.
STALE_S = 60.0
HEARTBEAT_S = 15.0
POLL_S = 5.0

Logger = logging.Logger | logging.LoggerAdapter


@dataclass(frozen=True)
class Holder:
    """Who holds a root's lock, as written in the lock file."""

    token: str
    label: str
    host: str
    pid: int
    since: float
    heartbeat: float
    run: str | None = None  # the Prefect flow run that holds it, if any

    def describe(self) -> str:
        return f"{self.label} (pid {self.pid} on {self.host})"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_reason(holder: Holder, stale_s: float = STALE_S, now: float | None = None) -> str | None:
    """Why ``holder``'s lock may be taken over, or None while it is live."""
    if holder.host == socket.gethostname() and not _alive(holder.pid):
        return "its process is gone"
    idle = (time.time() if now is None else now) - holder.heartbeat
    if idle > stale_s:
        return f"no heartbeat for {idle:.0f} s"
    return None


class RootLock:
    """The lock of one corpus root; ``acquire`` waits while another live run holds it."""

    def __init__(self, url: str, label: str, *, stale_s: float = STALE_S,
                 heartbeat_s: float = HEARTBEAT_S, poll_s: float = POLL_S,
                 logger: Logger = default_log, run: str | None = None,
                 on_takeover: Callable[[Holder, str], None] | None = None) -> None:
        self.url = url
        self.fs, root = fsspec.core.url_to_fs(url)
        self.path = f"{root.rstrip('/')}/{LOCK_FILE}"
        self.label = label
        self.stale_s, self.heartbeat_s, self.poll_s = stale_s, heartbeat_s, poll_s
        self.logger = logger
        self.run, self.on_takeover = run, on_takeover
        self.token = uuid.uuid4().hex
        self._since = 0.0
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def holder(self) -> Holder | None:
        """The current holder, or None when the root is free."""
        try:
            raw = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        try:
            return Holder(**json.loads(raw))
        except (ValueError, TypeError):
            # Created an instant ago and not written yet, or its writer was killed right then.
            return Holder("", "an unfinished lock file", "", -1, 0.0, self._modified())

    def _modified(self) -> float:
        try:
            return self.fs.modified(self.path).timestamp()
        except (NotImplementedError, FileNotFoundError, AttributeError):
            return time.time()

    def _record(self) -> bytes:
        me = Holder(self.token, self.label, socket.gethostname(), os.getpid(), self._since, time.time(),
                    self.run)
        return json.dumps(asdict(me)).encode()

    def try_acquire(self) -> Holder | None:
        """Take the lock if free or stale; returns None when taken, else the live holder."""
        self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        self._since = time.time()
        # FileExistsError: held, or left by a build that died; the holder's record tells which.
        with suppress(FileExistsError), self.fs.open(self.path, "xb") as handle:
            handle.write(self._record())
            return None
        holder = self.holder()
        if holder is None:
            return self.try_acquire()
        # Writing a lock file takes far less than a heartbeat: one left unfinished is abandoned.
        reason = stale_reason(holder, self.stale_s if holder.token else 2 * self.heartbeat_s)
        if reason is None:
            return holder
        if self.holder() != holder:  # taken over (or released) by another run meanwhile
            return self.try_acquire()
        self.logger.warning("%s: taking over the lock of %s: %s", self.url, holder.describe(), reason)
        self.fs.rm_file(self.path)
        if self.on_takeover is not None and holder.token:
            self.on_takeover(holder, reason)
        return self.try_acquire()

    def acquire(self) -> None:
        """Wait until the lock is ours, saying once per holder who is being waited for."""
        waited_for: str | None = None
        while (holder := self.try_acquire()) is not None:
            if holder.token != waited_for:
                waited_for = holder.token
                self.logger.warning(
                    "%s is being built by %s since %s; waiting for it to finish (checking every %g s)",
                    self.url, holder.describe(), time.strftime("%Y-%m-%d %H:%M:%S %Z",
                                                              time.localtime(holder.since)), self.poll_s)
            time.sleep(self.poll_s)
        if waited_for is not None:
            self.logger.warning("%s: lock taken after waiting", self.url)
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="vlcorpus-rootlock", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            current = self.holder()
            if current is None or current.token != self.token:
                self.logger.error("%s: lost the build lock to %s", self.url,
                                  current.describe() if current else "nobody")
                return
            # Written aside and moved into place, so that readers never see half a record.
            aside = f"{self.path}.{self.token}"
            self.fs.pipe_file(aside, self._record())
            self.fs.mv(aside, self.path)

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
        current = self.holder()
        if current is not None and current.token == self.token:
            self.fs.rm_file(self.path)


@contextmanager
def root_lock(url: str, label: str, *, stale_s: float = STALE_S, heartbeat_s: float = HEARTBEAT_S,
              poll_s: float = POLL_S, logger: Logger = default_log, run: str | None = None,
              on_takeover: Callable[[Holder, str], None] | None = None) -> Iterator[RootLock]:
    """Hold ``url``'s build lock for the block (waiting for a live holder to finish first)."""
    lock = RootLock(url, label, stale_s=stale_s, heartbeat_s=heartbeat_s, poll_s=poll_s, logger=logger,
                    run=run, on_takeover=on_takeover)
    lock.acquire()
    try:
        yield lock
    finally:
        lock.release()
