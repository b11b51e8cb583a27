"""A batch stuck in native code is a stall: its stacks go to the log, its items fail as internal
(the next run retries them), the stage stops, and the build's health says where; a batch that is
slow but beats is left alone."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, replace
from types import SimpleNamespace

import stagekit
from pipeline.config import HealthConfig
from pipeline.compose.health import assess
from pipeline.progress import beat
from pipeline.runner import RetryPolicy, StageContext, per_item, run_stage
from pipeline.corpus.storage import Corpus

_STUCK = threading.Event()  # never set while a test waits on it: a deadlock, as native code has
_INSIDE = threading.Semaphore(0)  # released on entering the deadlock, taken back on leaving it


def _ctx(url: str, stall_s: float | None) -> StageContext:
    config = SimpleNamespace(execution=SimpleNamespace(stall_s=stall_s))
    return StageContext(Corpus(url), config=config, retry=RetryPolicy(1, 0.0, 0.0))


def _hangs_on_stuck(item, ctx):
    if "stuck" in item.key:
        _INSIDE.release()
        _STUCK.wait(60)
        _INSIDE.acquire()
    return stagekit._download(item, ctx)


def _slow_but_beating(item, ctx):
    for _ in range(6):  # 1.8 s an item, over a stall_s of 1 s
        time.sleep(0.3)
        beat()
    return stagekit._download(item, ctx)


def test_a_stuck_batch_fails_as_internal_with_its_stacks_logged_and_the_next_run_retries(memory_root, caplog):
    ctx = _ctx(memory_root, stall_s=1.0)
    stagekit.make_videos(ctx.corpus, 3, extra=("stuck1",), partitions=1)
    stage = replace(stagekit.DOWNLOAD, process=per_item(_hangs_on_stuck))
    with caplog.at_level(logging.ERROR, logger="vlcorpus"):
        report = run_stage(stage, ctx, batch_size=1)
    # The stage returned while its stuck item was still stuck (not once the wait ran out).
    assert _INSIDE.acquire(blocking=False), "the stage waited for the stuck item"
    _INSIDE.release()
    assert report.stopped.startswith("stalled: download p00000 made no progress for 1 s")
    assert report.errors == {"internal": 1}
    errors = ctx.corpus.read("errors").to_pylist()
    assert [(e["item_id"], e["kind"]) for e in errors] == [("demo-stuck1", "internal")]
    assert "execution.stall_s" in errors[0]["message"]
    # Every thread's stack, the stuck one's wait among them.
    dumps = [r.getMessage() for r in caplog.records if "every thread's stack" in r.getMessage()]
    assert dumps and "_hangs_on_stuck" in dumps[0] and "Thread 'batch download p00000'" in dumps[0]
    # The build that ran it is unhealthy, and says where it stalled.
    health = assess(HealthConfig(), {"stages": {"download": asdict(report)},
                                     "tables": {"clips": 10}})
    assert any(p.startswith("stalled: download p00000") for p in health.problems), health.problems
    # Internal is no verdict: the next run tries the stuck item again (now it goes through).
    _STUCK.set()
    try:
        again = run_stage(stage, ctx, batch_size=1)
    finally:
        _STUCK.clear()
    assert again.skipped_failed == 0 and again.ok >= 1 and again.stopped is None
    assert "demo-stuck1" in set(ctx.corpus.done("downloads"))


def test_a_slow_batch_that_beats_is_no_stall(memory_root):
    ctx = _ctx(memory_root, stall_s=1.0)
    stagekit.make_videos(ctx.corpus, 2, partitions=1)
    report = run_stage(replace(stagekit.DOWNLOAD, process=per_item(_slow_but_beating)), ctx, batch_size=2)
    assert (report.ok, report.stopped, report.errors) == (2, None, {})


def test_no_watch_runs_the_batch_in_the_callers_thread(memory_root):
    ctx = _ctx(memory_root, stall_s=None)
    stagekit.make_videos(ctx.corpus, 1, partitions=1)
    threads = []

    def where(item, c):
        threads.append(threading.current_thread())
        return stagekit._download(item, c)

    run_stage(replace(stagekit.DOWNLOAD, process=per_item(where)), ctx, batch_size=1)
    assert threads == [threading.current_thread()]
