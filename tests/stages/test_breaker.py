"""The download breaker's policy (pipeline/download/breaker.py) on explicit times: when an egress trips,
how its cool-down grows and ends, which egress a download takes, when a block stops the stage,
and how an HTTP 403 is judged."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipeline.download.breaker import Gate, Policy, blocked_for, choose, fresh, paused, refused, succeeded
from pipeline.errors import ErrorKind, StageStopped
from pipeline.download.limits import PROCESS

POLICY = Policy(threshold=3, window_s=60, cooldown_s=10, cooldown_max_s=35, max_block_s=100)


def _refusals(videos: list[str], strong: bool = True, start: float = 0.0) -> dict:
    state = None
    for i, video in enumerate(videos):
        state = refused(state, video, strong, admitted=start + i, now=start + i, policy=POLICY)
    return state


def test_threshold_counts_different_videos_within_the_window():
    assert _refusals(["a", "a", "a", "b"])["trips"] == 0  # one video refused again is one
    tripped = _refusals(["a", "b", "c"])
    assert (tripped["trips"], tripped["since"], tripped["open_until"]) == (1, 2.0, 12.0)
    spread = None
    for i, video in enumerate(["a", "b", "c"]):  # 61 s apart: never three in one window
        spread = refused(spread, video, True, i * 61.0, i * 61.0, POLICY)
    assert spread["trips"] == 0


def test_403s_count_like_other_refusals_once_they_repeat_across_videos():
    assert _refusals(["a", "a"], strong=False)["trips"] == 0
    assert _refusals(["a", "b", "c"], strong=False)["trips"] == 1


def test_a_403_before_a_download_that_got_through_no_longer_counts():
    """Videos' own 403s among downloads that get through (private videos in a crawl) never
    add up to a trip; 429s do, as a session near its rate limit meets them between downloads."""
    for strong, trips in [(False, 0), (True, 1)]:
        state = _refusals(["a", "b"], strong=strong)
        state = succeeded(state, admitted=2.5, now=3.0)
        assert refused(state, "c", strong, admitted=3.0, now=3.0, policy=POLICY)["trips"] == trips
    # A download let through before the 403 shows nothing about it.
    state = succeeded(_refusals(["a", "b"], strong=False, start=1.0), admitted=0.5, now=3.0)
    assert refused(state, "c", False, admitted=3.0, now=3.0, policy=POLICY)["trips"] == 1


def test_cooldown_doubles_while_refused_and_resets_after_a_success():
    state = _refusals(["a", "b", "c"])
    # The first refusal after a cool-down trips again at once, for twice as long, up to the max.
    for trips, cooldown in [(2, 20), (3, 35), (4, 35)]:
        now = state["open_until"]
        state = refused(state, "z", True, admitted=now, now=now, policy=POLICY)
        assert (state["trips"], state["open_until"] - now, state["since"]) == (trips, cooldown, 2.0)
    state = succeeded(state, admitted=state["open_until"], now=state["open_until"] + 1)
    assert (state["trips"], state["since"]) == (0, None)


def test_downloads_that_began_before_a_trip_neither_trip_again_nor_end_the_block():
    state = _refusals(["a", "b", "c"])
    assert refused(state, "d", True, admitted=1.0, now=5.0, policy=POLICY) == state
    assert succeeded(state, admitted=1.0, now=5.0)["since"] == 2.0


def test_a_blocked_egress_is_rotated_out_until_all_are_blocked():
    blocked = _refusals(["a", "b", "c"])
    states = {"proxy-1": blocked, "proxy-2": fresh()}
    assert choose(states, now=5.0) == ("proxy-2", 0.0)
    assert blocked_for(states, now=5.0) is None
    both = {"proxy-1": blocked, "proxy-2": _refusals(["d", "e", "f"], start=4.0)}
    assert choose(both, now=7.0) == (None, 5.0)  # proxy-1 opens again at 12
    assert blocked_for(both, now=7.0) == 1.0  # since proxy-2 tripped at 6
    # Cooled down but still blocked: probed, after any egress that is not blocked.
    assert choose(both, now=12.0) == ("proxy-1", 0.0)


def test_pauses_are_when_every_egress_cools_down_at_once():
    one = {"pauses": [[10.0, 20.0], [30.0, 50.0]]}
    other = {"pauses": [[15.0, 35.0]]}
    assert paused([one], 0.0, 100.0) == (2, 30.0)
    assert paused([one], 40.0, 100.0) == (1, 10.0)  # clipped to the run
    assert paused([one, other], 0.0, 100.0) == (2, 10.0)  # 15-20 and 30-35
    assert paused([one, fresh()], 0.0, 100.0) == (0, 0.0)


class _Clock:
    """Time that moves only when the gate sleeps, so the test runs instantly."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _gate(name: str, egresses: list[str]) -> tuple[Gate, _Clock]:
    clock = _Clock()
    return Gate(PROCESS.store(name), POLICY, egresses, clock=clock, sleep=clock.sleep), clock


def test_gate_waits_out_pauses_then_stops_past_max_block_s(request):
    gate, clock = _gate(request.node.name, ["direct"])
    for video in "abc":
        ticket = gate.admit()
        paused_now = gate.refused(ticket, video)
    assert paused_now
    probes = [clock.now]
    with pytest.raises(StageStopped) as stopped:
        while True:
            ticket = gate.admit()  # sleeps through each cool-down, then probes
            probes.append(clock.now)
            assert ticket.probing
            gate.refused(ticket, "probe")
    waits = [b - a for a, b in zip(probes, probes[1:])]
    assert waits == [10, 20, 35, 35]  # blocked 100 s; the next pause would end after that
    message = str(stopped.value)
    assert "download.max_block_s" in message and "left to do" in message
    for hint in ("cookies", "proxies", "preset: sleep", "rate_limit", "wait"):
        assert hint in message
    assert gate.paused(0, clock.now) == (1, 100.0)  # one pause: each probe failed at once


def test_a_probe_that_succeeds_ends_the_block(request):
    gate, clock = _gate(request.node.name, ["direct"])
    for video in "abc":
        gate.refused(gate.admit(), video)
    ticket = gate.admit()
    gate.succeeded(ticket)
    after = gate.admit()
    assert not after.probing and sum(clock.slept) == 10


def test_one_runs_403_is_a_block_whatever_got_through_after_it(request):
    """A block that reaches fewer videos than the threshold never trips the breaker: the
    videos it refused are tried again next run, not lost."""
    gate, clock = _gate(request.node.name, ["direct"])
    ticket = gate.admit()
    gate.refused(ticket, "forbidden", strong=False)
    at = clock.now
    for _ in range(3):
        clock.now += 1
        gate.succeeded(gate.admit())
    assert gate.forbidden_kind(ticket, at) == ErrorKind.BLOCKED


def test_a_403_again_in_a_later_run_is_the_videos_own_only_when_other_videos_got_through_after_it(request):
    gate, clock = _gate(request.node.name, ["direct"])
    before = gate.admit()
    clock.now += 1
    earlier = clock.now  # the earlier run's 403 of the video, taken as a block
    clock.now += 100
    ticket = gate.admit()
    gate.refused(ticket, "forbidden", strong=False)
    at = clock.now
    assert gate.forbidden_kind(ticket, at, earlier) == ErrorKind.BLOCKED  # nothing to compare with yet
    clock.now += 1
    # A download let through before the 403s that ends after them may have sent every request
    # before them: no evidence that the site still served.
    gate.succeeded(before)
    assert gate.forbidden_kind(ticket, at, earlier) == ErrorKind.BLOCKED
    gate.succeeded(gate.admit())
    assert gate.forbidden_kind(ticket, at, earlier) == ErrorKind.PERMANENT
    # The same 403 when 403s of other videos trip the egress after it is a block, whatever
    # got through once the pause was over.
    again = gate.admit()
    gate.refused(again, "forbidden", strong=False)
    at = clock.now
    for video in "bc":
        clock.now += 1
        gate.refused(gate.admit(), video, strong=False)
    gate.succeeded(gate.admit())
    assert sum(clock.slept) == 10
    assert gate.forbidden_kind(again, at, earlier) == ErrorKind.BLOCKED


def test_a_403_again_in_a_later_run_with_downloads_in_between_is_the_videos_own(request):
    """The last video left to download meets its 403 alone: no other video gets through after
    it in that run. Its earlier run's 403, with downloads since, decides."""
    gate, clock = _gate(request.node.name, ["direct"])
    earlier = clock.now
    clock.now += 1
    gate.succeeded(gate.admit())  # other videos downloaded after the first 403
    clock.now += 100  # the next run: the video alone, 403 again
    alone = gate.admit()
    gate.refused(alone, "forbidden", strong=False)
    assert gate.forbidden_kind(alone, clock.now) == ErrorKind.BLOCKED
    assert gate.forbidden_kind(alone, clock.now, earlier) == ErrorKind.PERMANENT


class _SlowStore:
    """A process store whose updates take a while (as a cluster-wide one does) and are counted."""

    def __init__(self, name: str) -> None:
        self.inner, self.updates = PROCESS.store(name), 0

    def read(self, keys):
        return self.inner.read(keys)

    def update(self, key, change):
        self.updates += 1
        time.sleep(0.2)
        return self.inner.update(key, change)


def test_successes_of_a_healthy_egress_reach_the_store_at_most_every_few_seconds(request):
    clock = _Clock()
    store = _SlowStore(request.node.name)
    gate = Gate(store, POLICY, ["direct"], clock=clock, sleep=clock.sleep)
    tickets = [gate.admit() for _ in range(4)]
    start = threading.Barrier(len(tickets))

    def end(ticket):
        start.wait()
        gate.succeeded(ticket)

    # Downloads that end together: one write, not one each while the first is under way.
    with ThreadPoolExecutor(len(tickets)) as pool:
        list(pool.map(end, tickets))
    assert store.updates == 1
    clock.now += 6  # past _OK_EVERY_S: the next success is written again
    gate.succeeded(gate.admit())
    assert store.updates == 2
    # A success after a 403 is written at once: the 403 no longer counts for any worker.
    clock.now += 1
    gate.refused(gate.admit(), "own", strong=False)
    before = store.updates
    clock.now += 1
    gate.succeeded(gate.admit())
    assert store.updates == before + 1 and store.read(["direct"])["direct"]["events"] == []
    # While blocked every success is written: the first one after the trip ends the block.
    for video in "abc":
        gate.refused(gate.admit(), video)
    before = store.updates
    gate.succeeded(gate.admit())
    assert store.updates == before + 1 and not gate.admit().probing
