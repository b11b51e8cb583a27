"""The network watch of downloads (pipeline/download/outage.py) on explicit times: when the network
counts as down, what ends an outage, a host failing alone, and the stop past max_outage_s."""

from __future__ import annotations

import pytest

from pipeline.download.breaker import Policy
from pipeline.errors import NetworkError, PermanentError
from pipeline.download.limits import PROCESS
from pipeline.download.outage import DOWNLOADS, NetworkDown, Watch, failed, fresh, network_down, reached

POLICY = Policy(threshold=3, window_s=60, cooldown_s=10, cooldown_max_s=35, max_block_s=100)


def _failures(pairs: list[tuple[str, str]], state=None, start: float = 0.0) -> dict:
    for i, (video, host) in enumerate(pairs):
        state = failed(state, video, host, admitted=start + i, now=start + i, policy=POLICY)
    return state


def test_failures_in_a_row_of_different_videos_take_the_network_as_down():
    assert _failures([("a", "x"), ("a", "x"), ("b", "y")])["since"] is None  # one video is one
    down = _failures([("a", "x"), ("b", "y"), ("c", "x")])
    assert (down["trips"], down["since"], down["open_until"]) == (1, 2.0, 12.0)
    # A site reached in between breaks the row.
    state = _failures([("a", "x"), ("b", "y")])
    state = reached(state, "z", admitted=1.5)
    assert _failures([("c", "x")], state, start=2)["since"] is None


def test_one_host_failing_while_another_was_reached_is_that_hosts_trouble():
    state = reached(fresh(), "live", admitted=0.0)
    alone = _failures([("a", "gone"), ("b", "gone"), ("c", "gone")], state, start=1)
    assert alone["since"] is None and len(alone["events"]) == 3
    # The same host failing when it was the one reached last (a one-site corpus): the network.
    state = reached(fresh(), "site", admitted=0.0)
    assert _failures([("a", "site"), ("b", "site"), ("c", "site")], state, start=1)["trips"] == 1
    assert _failures([("d", "live")], alone, start=4)["trips"] == 1  # a second host fails too


def test_a_failing_probe_trips_again_and_a_download_after_the_trip_ends_the_outage():
    state = _failures([("a", "x"), ("b", "y"), ("c", "x")])
    state = failed(state, "z", "x", admitted=12.0, now=12.0, policy=POLICY)
    assert (state["trips"], state["open_until"], state["since"]) == (2, 32.0, 2.0)
    # A download let through before the trip ends nothing; one after it ends the outage.
    assert reached(state, "x", admitted=1.0)["since"] == 2.0
    assert (reached(state, "x", admitted=32.0)["since"], reached(state, "x", 32.0)["trips"]) == (None, 0)


class _Clock:
    def __init__(self) -> None:
        self.now, self.slept = 1000.0, []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_watch_waits_out_an_outage_then_stops_past_max_outage_s(request):
    clock = _Clock()
    watch = Watch(PROCESS.store(request.node.name), POLICY, DOWNLOADS, clock=lambda: clock.now, sleep=clock.sleep)
    lookup = NetworkError("Failed to resolve 'x' ([Errno -3] Temporary failure in name resolution)")
    for video, host in [("a", "x"), ("b", "y")]:  # the video's failure, while the network may be up
        with pytest.raises(NetworkError), watch.attempt(video, host, clock.now):
            raise lookup
    with watch.attempt("c", "x", clock.now) as attempt:
        raise lookup
    assert attempt.wait  # the third failure took the network as down: swallowed, to wait
    with pytest.raises(NetworkDown) as stop:
        while True:
            watch.admit()
            with watch.attempt("probe", "x", clock.now):
                raise lookup
    assert network_down(str(stop.value)) and "download.max_outage_s (100 s)" in str(stop.value)
    assert watch.paused(1000, clock.now)[0] == 1 and watch.paused(1000, clock.now)[1] > 90
    # The video's own error says the site was reached: the outage is over.
    with pytest.raises(PermanentError), watch.attempt("d", "x", clock.now):
        raise PermanentError("HTTP Error 404: Not Found")
    watch.admit()
