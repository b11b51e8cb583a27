"""The circuit breaker of downloads: when a site refuses the session rather than a video,
every download through that connection pauses, with a cool-down that grows while the refusals
go on, and a block that outlasts ``download.max_block_s`` stops the stage.

Refusals are counted per *egress* (the direct connection, or one proxy). The bot check, HTTP
429 and "try again later" are strong signals; an HTTP 403 is weak (it may be the video's own:
private media, a missing PO token), so it counts only as one video among others, and only until
a download let through after it succeeds (the site served after it: no block). When
``threshold`` different videos were refused through one egress within ``window_s``, it trips:
nothing goes out through it for ``cooldown_s``, doubled with each trip until a download
succeeds again (the first refusal after a cool-down trips it again at once). A download takes
the first egress that is not cooling down, so a blocked proxy is rotated out; when all of them
are, downloads wait.

The states live in a store of pipeline.download.limits, shared by every worker and build that name the
same ``download.concurrency_limit`` once flows/ installs Prefect's.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ErrorKind, StageStopped
from pipeline.download.limits import State, Store
from pipeline.progress import log

PAUSES_KEPT = 20  # per egress: a store entry stays small
OK_EVERY_S = 5.0  # successes of a healthy egress reach the store at most this often
POLL_S = 5.0  # a paused download reads the state again this often: other builds change it


@dataclass(frozen=True)
class Policy:
    threshold: int = 3
    window_s: float = 300.0
    cooldown_s: float = 60.0
    cooldown_max_s: float = 900.0
    max_block_s: float = 3600.0

    def cooldown(self, trips: int) -> float:
        return min(self.cooldown_max_s, self.cooldown_s * 2 ** max(0, trips - 1))


def fresh() -> State:
    return {
        "events": [],  # [time, video tag, strong] of refusals since the last trip, one per video
        "open_until": 0.0,  # nothing goes out through this egress before this time
        "trips": 0,  # since the last success: the cool-down doubles with each
        "since": None,  # when the current block began (its first trip); None: not blocked
        "tripped_at": 0.0,
        "last_ok": 0.0,  # when the latest download that succeeded was let through
        "pauses": [],  # [start, end] of the last cool-downs, for reports
    }


def video_tag(video: str) -> str:
    """A short stand-in for a video id in a shared state: states stay small."""
    return hashlib.sha1(video.encode()).hexdigest()[:8]


def recent_events(s: State, video: str, admitted: float, now: float, policy: Policy) -> list[list] | None:
    """The events of ``s`` still in the window, without ``video``'s (one video counts once); None
    when its download began before the last trip, which already paused it."""
    if admitted < s["tripped_at"]:
        return None
    tag = video_tag(video)
    return [e for e in s["events"] if now - e[0] <= policy.window_s and e[1] != tag]


def refused(state: State | None, video: str, strong: bool, admitted: float, now: float,
            policy: Policy) -> State:
    """``state`` after a refusal of ``video``, whose download was let through at ``admitted``."""
    s = fresh() | (state or {})
    events = recent_events(s, video, admitted, now, policy)
    if events is None:
        return s
    events.append([now, video_tag(video), strong])
    blocked = s["since"] is not None
    if (strong and blocked) or len(events) >= policy.threshold:
        return tripped(s, now, policy, ongoing=blocked)
    return s | {"events": events}


def tripped(s: State, now: float, policy: Policy, ongoing: bool) -> State:
    """``s`` tripped at ``now``: every download paused for the next trip's cool-down, the pause
    recorded; ``ongoing``: the trouble began earlier and keeps its start."""
    trips = s["trips"] + 1
    until = now + policy.cooldown(trips)
    return s | {"events": [], "trips": trips, "since": s["since"] if ongoing else now,
                "tripped_at": now, "open_until": until,
                "pauses": (s["pauses"] + [[now, until]])[-PAUSES_KEPT:]}


def _served_after(event: list, admitted: float) -> bool:
    """Whether a download let through at ``admitted`` shows that the 403 of ``event`` was no
    block. (A strong refusal keeps counting: a session near its rate limit is refused now and
    then between downloads. Events without the flag are strong.)"""
    return event[2:] == [False] and event[0] < admitted


def succeeded(state: State | None, admitted: float, now: float) -> State:
    """``state`` after a download let through at ``admitted`` succeeded: a download that began
    after the last trip ends the block, and the 403s met before it no longer count."""
    s = fresh() | (state or {})
    # Its admission, not its end: only a download let through after a refusal shows that the
    # site served after it (one that ends later may have sent every request before).
    s["last_ok"] = max(s["last_ok"], admitted)
    s["events"] = [e for e in s["events"] if not _served_after(e, admitted)]
    if admitted >= s["tripped_at"]:
        s |= {"trips": 0, "since": None}
    return s


def choose(states: dict[str, State], now: float) -> tuple[str | None, float]:
    """The egress to use now (an unblocked one first, in order), or None and the seconds until
    one is open again. ``states`` is in the order of the configured egresses."""
    ready = [e for e, s in states.items() if s["open_until"] <= now]
    if ready:
        healthy = [e for e in ready if states[e]["since"] is None]
        return (healthy or ready)[0], 0.0
    return None, min(s["open_until"] for s in states.values()) - now


def blocked_for(states: dict[str, State], now: float) -> float | None:
    """Seconds since every egress has been blocked; None while one is not."""
    since = [s["since"] for s in states.values()]
    if any(t is None for t in since):
        return None
    return now - max(since)


def paused(states: Sequence[State], start: float, end: float) -> tuple[int, float]:
    """How many pauses (every egress cooling down at once) fell between ``start`` and ``end``,
    and for how many seconds in all."""
    cuts = sorted({start, end} | {min(max(t, start), end) for s in states
                                  for pause in s["pauses"] for t in pause})
    count, total, before = 0, 0.0, False
    for a, b in zip(cuts, cuts[1:]):
        mid = (a + b) / 2
        inside = bool(states) and all(any(p[0] <= mid < p[1] for p in s["pauses"])
                                      for s in states)
        if inside:
            total += b - a
            count += not before
        before = inside
    return count, total


def duration(seconds: float) -> str:
    """Seconds as a reader takes them: "45 s", "12 min"."""
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def stop_message(blocked_s: float, policy: Policy) -> str:
    return (f"downloads stopped: the site has refused this session for {duration(blocked_s)} "
            f"(bot check, HTTP 429, 'try again later' or HTTP 403 across videos), longer than "
            f"download.max_block_s ({policy.max_block_s:g} s). The videos not downloaded are "
            f"left to do, not failed: the next run tries them again. To get through sooner, give "
            f"a signed-in browser's cookies (download.cookies_file or cookies_from_browser), "
            f"another egress (download.proxies), a slower pace (download.preset: sleep, a lower "
            f"download.rate_limit), or wait: YouTube lifts a session's rate limit within about "
            f"an hour.")


@dataclass(frozen=True)
class Ticket:
    """A download let through: the egress it uses, when, and whether that egress was blocked
    (let through to probe whether the block is over)."""

    egress: str
    admitted: float
    probing: bool


class Gate:
    """The breaker as one download stage uses it; threads of a batch share one."""

    def __init__(self, store: Store, policy: Policy, egresses: Sequence[str],
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Any] = time.sleep) -> None:
        self.store, self.policy, self.egresses = store, policy, list(egresses)
        self.clock, self.sleep = clock, sleep
        self._seen: dict[str, State] = {}
        self._local_ok: dict[str, float] = {}
        self._wrote: dict[str, float] = {}  # when this gate last wrote a success, per egress
        self._lock = threading.Lock()

    def _read(self) -> dict[str, State]:
        stored = self.store.read(self.egresses)
        self._seen = {e: fresh() | (stored[e] or {}) for e in self.egresses}
        return self._seen

    def admit(self) -> Ticket:
        """Wait until an egress is open and return it; StageStopped when every egress has been
        blocked for longer than ``max_block_s`` by the time one would open."""
        while True:
            now = self.clock()
            states = self._read()
            egress, wait = choose(states, now)
            if egress is not None:
                return Ticket(egress, now, probing=states[egress]["since"] is not None)
            blocked = blocked_for(states, now)
            if blocked is not None and blocked + wait > self.policy.max_block_s:
                raise StageStopped(stop_message(blocked + wait, self.policy))
            log.info("downloads paused for %.1f s: the site is refusing this session", wait)
            self.sleep(min(wait, POLL_S))

    def refused(self, ticket: Ticket, video: str, strong: bool = True) -> bool:
        """Record that ``video`` was refused; True when its egress is now cooling down (the
        video may then wait for it like the others)."""
        now = self.clock()
        state = self.store.update(ticket.egress, lambda s: refused(
            s, video, strong, ticket.admitted, now, self.policy))
        if state["tripped_at"] == now:
            log.warning("the site refuses this session (egress %s): downloads pause for %.1f s "
                        "(pause %d of this block)", ticket.egress, state["open_until"] - now,
                        state["trips"])
        return state["open_until"] > now

    def succeeded(self, ticket: Ticket) -> None:
        now, egress = self.clock(), ticket.egress
        with self._lock:
            self._local_ok[egress] = max(self._local_ok.get(egress, 0.0), ticket.admitted)
            seen = self._seen.get(egress) or fresh()
            healthy = seen["since"] is None and not seen["trips"] and not any(
                _served_after(e, ticket.admitted) for e in seen["events"])
            # Downloads that end together write once: each write waits for the store's lock.
            if healthy and now - max(seen["last_ok"], self._wrote.get(egress, 0.0)) <= OK_EVERY_S:
                return
            self._wrote[egress] = now
        self._seen[egress] = self.store.update(egress, lambda s: succeeded(s, ticket.admitted, now))

    def forbidden_kind(self, ticket: Ticket, at: float, earlier: float | None = None) -> ErrorKind:
        """An HTTP 403 at ``at`` is the video's own (permanent) only the second time: the same
        video met a 403 taken as a block in an earlier run (at ``earlier``), this egress was not
        blocked for this one and has not tripped since, and it let through after the earlier
        403 a download that succeeded. Otherwise it is a block, not final: the next run tries
        again. One run's 403s alone decide nothing: a block that reaches fewer videos than
        ``threshold`` never trips the breaker, and the videos it refused must not be lost."""
        if earlier is None:
            return ErrorKind.BLOCKED
        state = self._read()[ticket.egress]
        last_ok = max(state["last_ok"], self._local_ok.get(ticket.egress, 0.0))
        own = not ticket.probing and state["tripped_at"] < ticket.admitted and last_ok > min(at, earlier)
        return ErrorKind.PERMANENT if own else ErrorKind.BLOCKED

    def paused(self, start: float, end: float) -> tuple[int, float]:
        return paused(list(self._read().values()), start, end)
