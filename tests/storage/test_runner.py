from __future__ import annotations

import logging
import traceback
from dataclasses import replace

import pyarrow.dataset as ds
import pytest

import stagekit
from pipeline.errors import ErrorKind, StageStopped
from pipeline.runner import Outcome, RetryPolicy, StageContext, error_row, run_stage
from pipeline.compose.status import partition_counts
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate


@pytest.fixture(autouse=True)
def _fresh_flaky():
    stagekit._flaky_seen.clear()


def _ctx(url: str, attempts: int = 3) -> StageContext:
    return StageContext(Corpus(url), config=None, retry=RetryPolicy(attempts, 0.0, 0.0))


def test_runs_all_items_and_records_each_failure_kind(memory_root):
    ctx = _ctx(memory_root)
    ids = stagekit.make_videos(ctx.corpus, 7, extra=("bad1", "gone1", "crash1", "flaky1", "silent1"))
    report = run_stage(stagekit.DOWNLOAD, ctx, batch_size=3)
    assert report.total == len(ids) == 12
    assert report.ok == 9  # 7 plain + flaky (retried) + silent (no rows, still done)
    assert dict(report.errors) == {"bad_input": 1, "permanent": 1, "internal": 1}
    errors = {r["item_id"]: r for r in ctx.corpus.read("errors").to_pylist()}
    assert errors["demo-bad1"]["kind"] == "bad_input"
    assert "truncated media" in errors["demo-bad1"]["message"]
    assert errors["demo-gone1"]["kind"] == "permanent"
    # Our own code failing is no verdict on the item: internal, and said so.
    assert errors["demo-crash1"]["kind"] == "internal"
    assert errors["demo-crash1"]["message"].startswith("internal error (a bug in vlcorpus")
    assert errors["demo-crash1"]["message"].endswith("ZeroDivisionError: division by zero")
    assert "demo-flaky1" not in errors  # succeeded on its retry
    assert set(ctx.corpus.done("downloads")) == set(ids) - set(errors)
    run_stage(stagekit.TRANSCRIBE, ctx, batch_size=4)
    done = ctx.corpus.done("segments")
    assert done["demo-silent1"] == 0 and set(done) == set(ids) - set(errors)
    assert validate(ctx.corpus) == []


def test_an_internal_error_is_retried_by_the_next_run_with_its_traceback_logged(memory_root, caplog):
    ctx = _ctx(memory_root)
    stagekit.make_videos(ctx.corpus, 2, extra=("crash1",))
    with caplog.at_level(logging.ERROR, logger="vlcorpus"):
        first = run_stage(stagekit.DOWNLOAD, ctx, batch_size=10)
    assert first.errors == {"internal": 1}
    logged = [r for r in caplog.records if r.exc_info]
    assert logged and "ZeroDivisionError" in "".join(traceback.format_exception(*logged[0].exc_info))
    second = run_stage(stagekit.DOWNLOAD, ctx, batch_size=10)  # no --retry-failed
    assert (second.skipped_failed, second.items, second.errors) == (0, 1, {"internal": 1})
    attempts = ctx.corpus.read("errors").column("attempt").to_pylist()
    assert sorted(attempts) == [1, 2]


# Rows earlier versions wrote as permanent, and the kind a build and ``status`` read them as.
_LEGACY = {
    # Our own failures, before the internal kind ("unexpected ...": the breaker's TypeError).
    "internal": ["unexpected TypeError: can only concatenate tuple (not \"list\") to tuple"] * 2,
    # A name that did not resolve (a DNS outage, a machine whose network was not up).
    "transient": ["[youtube] dQw4w9WgXcQ: Unable to download API page: HTTPSConnection(host='www.youtube.com', "
                  "port=443): Failed to resolve 'www.youtube.com' ([Errno -2] Name or service not known)",
                  "[generic] x: Unable to download webpage: <urlopen error [Errno -3] temporary failure in "
                  "name resolution>"],
}


@pytest.mark.parametrize("kind", sorted(_LEGACY))
def test_items_an_earlier_version_judged_lost_by_mistake_are_retried(memory_root, kind):
    """Items earlier versions failed for good on their own bug or on a network failure: the next
    run retries them, and ``status`` counts them under their real kind, to do; a 404 keeps its
    verdict."""
    ctx = _ctx(memory_root)
    ids = stagekit.make_videos(ctx.corpus, 3, extra=("gone1",), partitions=1)
    legacy = [error_row("download", vid, "permanent", message, 1) for vid, message in zip(ids, _LEGACY[kind])]
    legacy.append(error_row("download", "demo-gone1", "permanent", "HTTP Error 404: Not Found", 1))
    ctx.corpus.write_batch("errors", legacy, "old", "00000")
    counts = partition_counts(stagekit.DOWNLOAD, ctx, "00000")
    assert counts.failed == {kind: 2, "permanent": 1} and counts.todo == 3
    report = run_stage(stagekit.DOWNLOAD, ctx, batch_size=10)
    assert (report.skipped_failed, report.ok) == (1, 3)
    assert set(ctx.corpus.done("downloads")) == set(ids) - {"demo-gone1"}


def test_rerun_skips_done_and_permanent_failures(memory_root):
    ctx = _ctx(memory_root)
    stagekit.make_videos(ctx.corpus, 5, extra=("bad1",))
    run_stage(stagekit.DOWNLOAD, ctx, batch_size=2)
    before = ctx.corpus.read("downloads").sort_by("video_id")
    again = run_stage(stagekit.DOWNLOAD, ctx, batch_size=2)
    assert (again.skipped_done, again.skipped_failed, again.items) == (5, 1, 0)
    assert ctx.corpus.read("downloads").sort_by("video_id").equals(before)
    retried = run_stage(stagekit.DOWNLOAD, ctx, batch_size=2, retry_failed=True)
    assert retried.items == 1 and retried.errors["bad_input"] == 1
    attempts = ctx.corpus.read("errors").column("attempt").to_pylist()
    assert sorted(attempts) == [1, 2]


def test_transient_failure_exhausting_retries_is_retried_next_run(memory_root):
    ctx = _ctx(memory_root, attempts=1)
    stagekit.make_videos(ctx.corpus, 2, extra=("flaky1",))
    first = run_stage(stagekit.DOWNLOAD, ctx, batch_size=10)
    assert first.errors == {"transient": 1}
    second = run_stage(stagekit.DOWNLOAD, ctx, batch_size=10)
    assert second.items == 1 and second.ok == 1
    assert "demo-flaky1" in ctx.corpus.done("downloads")
    assert validate(ctx.corpus) == []


def test_new_inputs_are_picked_up_incrementally(memory_root):
    ctx = _ctx(memory_root)
    stagekit.make_videos(ctx.corpus, 3)
    run_stage(stagekit.DOWNLOAD, ctx, batch_size=2)
    stagekit.make_videos(ctx.corpus, 5)  # same batch name: replaces the videos batch
    report = run_stage(stagekit.DOWNLOAD, ctx, batch_size=2)
    assert (report.skipped_done, report.items) == (3, 2)
    new = ctx.corpus.read("downloads", filter=ds.field("video_id") == "demo-v004")
    assert new.num_rows == 1


def test_rejected_rows_fail_the_commit_not_silently(memory_root):
    corpus = Corpus(memory_root)
    from pipeline.corpus.tablefile import SchemaViolation

    with pytest.raises(SchemaViolation, match="unknown columns"):
        corpus.write_batch("videos", [{"video_id": "a", "titel": "x"}], "b", "00000")
    with pytest.raises(SchemaViolation, match="must not be null"):
        corpus.write_batch("videos", [{"video_id": "a"}], "b", "00000")
    assert corpus.table_files("videos") == []


def test_a_stopped_batch_commits_what_it_finished_and_leaves_the_rest_to_do(memory_root):
    ctx = _ctx(memory_root)
    stagekit.make_videos(ctx.corpus, 4, partitions=1)

    def stops_after_two(items, c):
        done = stagekit.DOWNLOAD.process(items[:1], c)
        refused = Outcome(items[1].key, kind=ErrorKind.BLOCKED, message="Too Many Requests")
        raise StageStopped("stopped: the site refuses this session", finished=[*done, refused])

    stopping = replace(stagekit.DOWNLOAD, process=stops_after_two)
    report = run_stage(stopping, ctx, batch_size=4)
    assert (report.items, report.ok, report.errors, report.left) == (4, 1, {"blocked": 1}, 2)
    assert report.stopped == "stopped: the site refuses this session"
    # Blocked is never final: the next run does the blocked item and the two left.
    again = run_stage(stagekit.DOWNLOAD, ctx, batch_size=4)
    assert (again.skipped_done, again.skipped_failed, again.ok) == (1, 0, 3)
    assert validate(ctx.corpus) == []


def test_a_stop_on_a_retry_leaves_the_retried_items_to_do_with_no_row(memory_root):
    """A network outage: the first attempt fails an item transient, the retry stops the stage
    before the item has an outcome. Its earlier failure is no outcome: no errors row."""
    ctx = _ctx(memory_root)
    stagekit.make_videos(ctx.corpus, 2, partitions=1)
    attempts = []

    def fails_then_stops(items, c):
        attempts.append([i.key for i in items])
        if len(attempts) == 1:
            return [*stagekit.DOWNLOAD.process(items[:1], c),
                    Outcome(items[1].key, kind=ErrorKind.TRANSIENT, message="Connection refused")]
        raise StageStopped("downloads stopped: the network is down")

    report = run_stage(replace(stagekit.DOWNLOAD, process=fails_then_stops), ctx, batch_size=2)
    assert len(attempts) == 2 and len(attempts[1]) == 1
    assert (report.ok, report.errors, report.left) == (1, {}, 1)
    assert ctx.corpus.read("errors").num_rows == 0
