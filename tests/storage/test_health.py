"""A build's health from its summary: the defaults catch a source that lists nothing and a stage
that fails most of what it tries; the health section moves the limits."""

from __future__ import annotations

from pipeline.config import HealthConfig
from pipeline.compose.health import assess


def _summary(**stages) -> dict:
    return {"root": "/data/c", "tables": {"clips": 40}, "stages": stages}


DISCOVER = {"queries": 2, "failed_queries": 0, "found": 10, "added": 3}


def _download(items: int, failed: int) -> dict:
    return {"items": items, "ok": items - failed, "errors": {"transient": failed} if failed else {}}


def test_a_build_that_did_its_work_is_healthy():
    health = assess(HealthConfig(), _summary(discover=DISCOVER, download=_download(10, 5),
                                             train={"t2v": {}}))
    assert health.healthy and health.as_dict()["message"] is None
    assert health.numbers == {"found": 10, "new": 3, "clips": 40,
                              "failed": {"discover": (0, 2), "download": (5, 10)}}


def test_a_rerun_with_nothing_new_to_do_is_healthy():
    assert assess(HealthConfig(), _summary(discover={**DISCOVER, "added": 0}, download=_download(0, 0))).healthy


def test_a_source_that_lists_nothing_is_unhealthy():
    health = assess(HealthConfig(), _summary(discover={"queries": 1, "failed_queries": 1, "found": 0, "added": 0}))
    assert not health.healthy
    message = health.as_dict()["message"]
    assert "the sources listed 0 videos (at least 1 expected; 1 of 1 queries failed)" in message
    assert message.startswith("The build of /data/c is unhealthy:") and "\n" not in message
    assert "vlcorpus status /data/c" in message


def test_a_stage_failing_more_than_half_is_unhealthy_and_limits_move_per_stage():
    summary = _summary(discover=DISCOVER, download=_download(10, 6), **{"featurize:resnet34": _download(4, 3)})
    health = assess(HealthConfig(), summary)
    assert [p.split(" (")[0] for p in health.problems] == ["download failed 6 of the 10 it tried",
                                                          "featurize:resnet34 failed 3 of the 4 it tried"]
    lenient = HealthConfig(max_failed_fraction={"download": 0.7, "featurize": 0.8})
    assert assess(lenient, summary).healthy
    assert not assess(HealthConfig(max_failed_fraction=0.1), _summary(download=_download(10, 2))).healthy


def test_a_failed_step_new_videos_and_clips_have_limits():
    health = assess(HealthConfig(min_new_videos=5, min_clips=100),
                    _summary(discover=DISCOVER, train={"failed": "internal error: boom"}))
    assert health.problems == [
        "discover added 3 new videos (at least 5 expected)",
        "train failed 1 of the 1 it tried (100% > 50%) (internal error: boom)",
        "the corpus holds 40 clips (at least 100 expected)",
    ]
    assert assess(HealthConfig(min_found_videos=0), _summary(discover={**DISCOVER, "found": 0, "added": 0})).healthy
