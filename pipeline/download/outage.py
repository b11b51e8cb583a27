"""The network watch of downloads and of discover's listings: when requests fail on the network
one after the other (no name resolves, connections refused or timing out), the network is taken
as down. Every download and listing then pauses, as for a block (pipeline/download/breaker.py):
the videos and queries wait instead of failing, one is let through after each cool-down to probe,
the cool-down doubles while the probes fail, and an outage longer than ``download.max_outage_s``
stops the stage in one line, with what it did not do left to do and no errors rows for it.

The network is down when ``threshold`` different videos (or queries) failed on it with no request
reaching a site in between (within ``window_s``), unless they all failed on one host while another
host was reached last: that is the host's trouble (a domain gone, a server down), not the
network's, and its videos fail on their own. The state lives in a store of
pipeline.download.limits, shared like the breaker's by every worker and build that name the same
``download.concurrency_limit``, so downloads and discover see one outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from pipeline.config import DownloadConfig
from pipeline.download import limits
from pipeline.download.breaker import OK_EVERY_S, POLL_S, Policy, duration, paused, recent_events, tripped, video_tag
from pipeline.errors import NetworkError, StageError, StageStopped
from pipeline.download.limits import State, Store
from pipeline.progress import log

_KEY = "network"
STOPPED = "stopped: the network is down"


@dataclass(frozen=True)
class Work:
    """What a watch holds back, in the words of its lines: ``name`` pauses and stops,
    ``failing`` is what failed in a row, ``left`` says what a stop leaves and when it is done."""

    name: str
    failing: str
    left: str


DOWNLOADS = Work("downloads", "downloads of several videos",
                 "The videos not downloaded are left to do, not failed: the next run tries them "
                 "again once the network is back.")


def fresh() -> State:
    return {
        "events": [],  # [time, video tag, host] of network failures since a site was last reached
        "open_until": 0.0,  # no download goes out before this time
        "trips": 0,  # since the network was last up: the cool-down doubles with each
        "since": None,  # when the outage began (its first trip); None: the network is up
        "tripped_at": 0.0,
        "last_ok": 0.0,  # admission time of the latest download that reached a site
        "ok_host": None,  # the host it reached
        "pauses": [],  # [start, end] of the last cool-downs, for reports
    }


def failed(state: State | None, video: str, host: str, admitted: float, now: float,
           policy: Policy) -> State:
    """``state`` after ``video`` (of ``host``), let through at ``admitted``, failed on the network."""
    s = fresh() | (state or {})
    events = recent_events(s, video, admitted, now, policy)
    if events is None:
        return s
    events.append([now, video_tag(video), host])
    down = s["since"] is not None
    one_host = len({e[2] for e in events}) == 1 and s["ok_host"] not in (None, host)
    if down or (len(events) >= policy.threshold and not one_host):
        return tripped(s, now, policy, ongoing=down)
    return s | {"events": events}


def reached(state: State | None, host: str, admitted: float) -> State:
    """``state`` after a download let through at ``admitted`` reached ``host`` (it succeeded, or
    the site answered with a refusal or an error of the video): the failures before it are no
    longer in a row, and one let through after the last trip ends the outage."""
    s = fresh() | (state or {})
    s["events"] = [e for e in s["events"] if e[0] > admitted]
    if admitted >= s["last_ok"]:
        s |= {"last_ok": admitted, "ok_host": host}
    if admitted >= s["tripped_at"]:
        s |= {"trips": 0, "since": None}
    return s


def stop_message(down_s: float, policy: Policy, work: Work) -> str:
    return (f"{work.name} {STOPPED} (requests for several videos or queries in a row failed on "
            f"it, and every probe since) for {duration(down_s)}, longer than "
            f"download.max_outage_s ({policy.max_block_s:g} s). {work.left}")


def network_down(stopped: str | None) -> bool:
    """Whether a stage's ``stopped`` message says the network was down."""
    return bool(stopped) and STOPPED in stopped


class NetworkDown(StageStopped):
    """The network has been down for longer than ``download.max_outage_s``."""


class Attempt:
    """One download through the watch, as a context: on leaving it, a network failure is
    recorded (and swallowed, with ``wait`` set, when the network is now down: the video waits
    and goes again), and any other outcome of the site (a success or the video's own error)
    tells the watch that the site was reached."""

    def __init__(self, watch: Watch, video: str, host: str, admitted: float) -> None:
        self.watch, self.video, self.host, self.admitted = watch, video, host, admitted
        self.wait = False

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> bool:
        if isinstance(exc, NetworkError):
            self.wait = self.watch.failed(self.video, self.host, self.admitted)
            return self.wait
        if exc is None or isinstance(exc, StageError):  # our own bugs say nothing of the network
            self.watch.reached(self.host, self.admitted)
        return False


class Watch:
    """The network watch as one download stage or one discover uses it; threads of a batch
    share one. Its ``policy`` is the breaker's, with ``max_block_s`` standing for
    ``download.max_outage_s``; ``work`` is what it holds back. A ``video`` below is whatever
    one request is for: a video, or one of discover's queries."""

    def __init__(self, store: Store, policy: Policy, work: Work, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Any] = time.sleep) -> None:
        self.store, self.policy, self.work, self.clock, self.sleep = store, policy, work, clock, sleep
        self._seen: State = fresh()
        self._wrote = 0.0
        self._lock = threading.Lock()

    def _read(self) -> State:
        self._seen = fresh() | (self.store.read([_KEY])[_KEY] or {})
        return self._seen

    def admit(self) -> None:
        """Wait while the network is down; NetworkDown when it has been down for longer than
        ``max_outage_s`` by the time the next probe would go."""
        while True:
            now = self.clock()
            state = self._read()
            wait = state["open_until"] - now
            if wait <= 0:
                return
            if state["since"] is not None and now - state["since"] + wait > self.policy.max_block_s:
                raise NetworkDown(stop_message(now - state["since"] + wait, self.policy, self.work))
            log.info("%s paused for %.1f s: the network is down", self.work.name, wait)
            self.sleep(min(wait, POLL_S))

    def attempt(self, video: str, host: str, admitted: float) -> Attempt:
        return Attempt(self, video, host, admitted)

    def failed(self, video: str, host: str, admitted: float) -> bool:
        """Record that ``video`` failed on the network; True when downloads now pause (the
        video may then wait like the others)."""
        now = self.clock()
        state = self.store.update(_KEY, lambda s: failed(s, video, host, admitted, now, self.policy))
        self._seen = state
        if state["tripped_at"] == now:
            # One warning an outage, however long: its probes failing say nothing new.
            level = logging.WARNING if state["trips"] == 1 else logging.INFO
            log.log(level, "the network is down: %s in a row failed on it; %s paused for %.1f s "
                    "(pause %d of this outage)", self.work.failing, self.work.name,
                    state["open_until"] - now, state["trips"])
        return state["open_until"] > now

    def reached(self, host: str, admitted: float) -> None:
        now = self.clock()
        with self._lock:
            seen = self._seen
            calm = not seen["events"] and seen["since"] is None and seen["ok_host"] == host
            # Downloads that end together write once: each write waits for the store's lock.
            if calm and now - max(seen["last_ok"], self._wrote) <= OK_EVERY_S:
                return
            self._wrote = now
        self._seen = self.store.update(_KEY, lambda s: reached(s, host, admitted))

    def others_up(self, host: str, at: float) -> bool:
        """Whether the network was up at ``at`` with another host than ``host`` reached within
        ``window_s`` before it: a failure of ``host`` then is its own."""
        state = self._read()
        return (state["since"] is None and state["ok_host"] not in (None, host)
                and state["last_ok"] >= at - self.policy.window_s)

    def paused(self, start: float, end: float) -> tuple[int, float]:
        return paused([self._read()], start, end)


def watch(cfg: DownloadConfig, work: Work) -> Watch:
    """The network watch of ``cfg`` (one per ``download.concurrency_limit``, in the store that
    pipeline.download.limits shares) for ``work``."""
    policy = Policy(cfg.network_threshold, cfg.block_window_s, cfg.network_cooldown_s,
                    cfg.network_cooldown_max_s, cfg.max_outage_s)
    return Watch(limits.store(f"{cfg.concurrency_limit}-network"), policy, work)
