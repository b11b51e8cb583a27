"""`vlcorpus status`: per stage done / to do / failed by kind, as a user types it, with the root
lock held by a build, and while batches are committed and compacted under it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from dataclasses import replace
from pathlib import Path

import pytest

import stagekit
from conftest import vlcorpus
from pipeline.corpus import partitions
from pipeline.errors import BlockedError, TransientError
from pipeline.runner import (
    RetryPolicy,
    Stage,
    StageContext,
    error_row,
    per_item,
    run_partition,
    run_stage,
    table_inputs,
)
from pipeline.shards.index import PartitionIndex, ShardEntry
from pipeline.corpus.storage import Corpus

CONFIG = """\
name: status_test
sources:
  - type: urls
    urls: [http://127.0.0.1/x]
transcribe:
  prefer: [manual, auto]
features:
  extractors:
    - name: resnet34
      weights: none
"""
EXTRA = ("bad1", "gone1", "crash1", "flaky1", "silent1", "blocked1", "later1")


def _download(item, ctx):
    if "blocked" in item.key:
        raise BlockedError(f"{item.key}: Sign in to confirm you're not a bot")
    if "later" in item.key:
        raise TransientError(f"{item.key}: HTTP Error 503")
    return stagekit._download(item, ctx)


DOWNLOAD = Stage(name="download", output="downloads", source="videos", inputs=table_inputs("videos"),
                 process=per_item(_download))


@pytest.fixture(autouse=True)
def _fresh_flaky():
    stagekit._flaky_seen.clear()


def _clip(vid: str, i: int) -> dict:
    return {"clip_id": f"{vid}-{i * 3000}-{i * 3000 + 3000}", "video_id": vid, "start_s": 3.0 * i,
            "end_s": 3.0 * i + 3, "text": f"s{i}", "source": "manual", "policy": "subtitle_span",
            "split": "train"}


def _feature(clip_id: str) -> dict:
    return {"clip_id": clip_id, "extractor": "resnet34", "weights": "none", "shape": [1], "values": [0.0]}


def build(root: Path) -> dict[str, dict]:
    """A corpus through every stage without media, with failures of every kind and stages
    half done; returns the figures status must find, worked out from what was put in."""
    root.mkdir(parents=True)
    (root / "config.yaml").write_text(CONFIG)
    ctx = StageContext(Corpus(str(root)), None, RetryPolicy(1, 0.0, 0.0))
    corpus = ctx.corpus
    ids = stagekit.make_videos(corpus, 8, extra=EXTRA)
    # Two runs: flaky1 fails (transient) then succeeds; blocked1 and later1 fail twice.
    run_stage(DOWNLOAD, ctx, batch_size=3)
    run_stage(DOWNLOAD, ctx, batch_size=3)
    downloaded = [v for v in ids if not any(k in v for k in ("bad", "gone", "crash", "blocked", "later"))]
    assert len(downloaded) == 10
    # Transcribe half done: the partitions holding the first two downloaded videos only.
    first = sorted({corpus.partition_of(v) for v in downloaded[:2]})
    for label in first:
        run_partition(stagekit.TRANSCRIBE, ctx, label, batch_size=2)
    transcribed = [v for v in downloaded if corpus.partition_of(v) in first]
    assert 0 < len(transcribed) < len(downloaded)
    # Align: videos with sentences (silent1 has none, so it is not upstream of align); the
    # first is bad input, the last left to do, the rest get two clips each.
    spoken = [v for v in transcribed if "silent" not in v]
    assert len(spoken) >= 3
    aligned = spoken[1:-1]
    corpus.write_partitioned("clips", [_clip(v, i) for v in aligned for i in range(2)], "syn", done=aligned)
    corpus.write_batch("errors", [error_row("align", spoken[0], "bad_input", "no sentence fits", 1)],
                       "align-syn", corpus.partition_of(spoken[0]))
    clips = sorted(_clip(v, i)["clip_id"] for v in aligned for i in range(2))
    # Featurize half the clips; one clip is bad input.
    featured = clips[: len(clips) // 2]
    corpus.write_partitioned("features/resnet34", [_feature(c) for c in featured], "syn", done=featured)
    broken = clips[-1]
    corpus.write_batch("errors", [error_row("featurize:resnet34", broken, "bad_input", "no frames", 1)],
                       "feat-syn", corpus.partition_of(partitions.video_of_clip(broken)))
    # Shard: the featured clips of one partition are in a shard.
    label = corpus.partition_of(partitions.video_of_clip(featured[0]))
    sharded = [c for c in featured if corpus.partition_of(partitions.video_of_clip(c)) == label]
    index = PartitionIndex(label)
    index.add(ShardEntry(0, "train", len(sharded)), sharded)
    index.save(corpus)
    # A failed corpus-wide step.
    corpus.write_batch("errors", [error_row("discover", "discover", "transient", "search timed out", 1)],
                       "discover-syn", partitions.CORPUS)
    return {
        "download": {"table": "downloads", "upstream": 15, "done": 10,
                     "failed": {"permanent": 1, "bad_input": 1, "transient": 1, "blocked": 1,
                                "internal": 1},
                     "final": 2, "todo": 3},
        "transcribe": {"table": "segments", "upstream": 10, "done": len(transcribed), "failed": {},
                       "final": 0, "todo": 10 - len(transcribed)},
        "align": {"table": "clips", "upstream": len(spoken), "done": len(aligned),
                  "failed": {"bad_input": 1}, "final": 1, "todo": 1},
        "featurize:resnet34": {"table": "features/resnet34", "upstream": len(clips), "done": len(featured),
                               "failed": {"bad_input": 1}, "final": 1,
                               "todo": len(clips) - len(featured) - 1},
        "shard": {"table": "shards", "upstream": len(clips), "done": len(sharded), "failed": {},
                  "final": 0, "todo": len(clips) - len(sharded)},
    }


def test_status_json_counts_every_stage(tmp_path):
    root = tmp_path / "corpus"
    expected = build(root)
    result = vlcorpus("status", str(root), "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["root"] == str(root) and status["partitions"] == 4
    assert list(status["stages"]) == list(expected)  # build order
    assert status["stages"] == expected
    assert status["corpus_errors"] == {"discover": {"transient": 1}}
    for counts in status["stages"].values():
        assert counts["upstream"] == counts["done"] + counts["final"] + counts["todo"]


def test_status_per_partition_adds_up_and_prints_a_table(tmp_path):
    root = tmp_path / "corpus"
    expected = build(root)
    result = vlcorpus("status", str(root), "--json", "--partitions")
    assert result.returncode == 0, result.stderr
    by_partition = json.loads(result.stdout)["by_partition"]
    assert sorted(by_partition) == partitions.labels(4)
    for stage, counts in expected.items():
        for figure in ("upstream", "done", "final", "todo"):
            assert sum(p[stage][figure] for p in by_partition.values()) == counts[figure]
    shown = vlcorpus("status", str(root), "--partitions")
    assert shown.returncode == 0, shown.stderr
    for text in ("featurize:resnet34", "bad_input", "blocked", "partitions with items to do"):
        assert text in shown.stdout


def test_status_agrees_with_the_runners_plan(tmp_path):
    from pipeline.config import load_config
    from pipeline.runner import plan_partition
    from pipeline.compose.stages import context
    from pipeline.compose.status import corpus_status, partition_stages

    root = tmp_path / "corpus"
    build(root)
    corpus = Corpus(str(root))
    cfg = load_config(root / "config.yaml")
    status = corpus_status(corpus, cfg)
    ctx = context(corpus, cfg)
    for stage in partition_stages(cfg):
        reports = [plan_partition(stage, ctx, p).report for p in corpus.labels()]
        counts = status["stages"][stage.name]
        assert counts["todo"] == sum(r.todo for r in reports)
        assert counts["done"] == sum(r.skipped_done for r in reports)
        assert counts["final"] == sum(r.skipped_failed for r in reports)


def test_status_runs_while_another_process_holds_the_root_lock(tmp_path):
    root = tmp_path / "corpus"
    expected = build(root)
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pipeline.corpus.rootlock import root_lock
        with root_lock({str(root)!r}, "a build in a test"):
            print("held", flush=True)
            sys.stdin.read()
        """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert (root / "_lock.json").exists()
        result = vlcorpus("status", str(root), "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["stages"] == expected
        assert (root / "_lock.json").exists()  # not taken over, not touched
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert holder.returncode == 0 and not (root / "_lock.json").exists()


def test_status_reads_while_batches_are_committed_and_compacted(tmp_path):
    """A download stage commits one batch per video and compacts each partition while status
    reads in a loop (a compaction deletes files status may have listed): every reading is
    whole (upstream = done + final + to do), never goes back, and the last one sees the stage
    finished."""
    from pipeline.config import load_config
    from pipeline.compose.status import corpus_status

    root = tmp_path / "corpus"
    root.mkdir()
    (root / "config.yaml").write_text(CONFIG)
    ctx = StageContext(Corpus(str(root)), None, RetryPolicy(1, 0.0, 0.0))
    stagekit.make_videos(ctx.corpus, 60, extra=("bad1", "gone1"))
    cfg = load_config(root / "config.yaml")
    # Every GATE-th item waits for a reading that began after it asked: status reads at least
    # 62 // GATE times in the middle of the stage, however fast either runs.
    gate, asked, reads, read = 6, [0], [0], threading.Condition()

    def after_a_reading(item, c):
        asked[0] += 1
        if asked[0] % gate == 0:
            with read:
                wanted = reads[0] + 2  # the one under way may have begun before
                read.wait_for(lambda: reads[0] >= wanted)
        return stagekit._download(item, c)

    stage = replace(stagekit.DOWNLOAD, process=per_item(after_a_reading))
    worker = threading.Thread(target=run_stage, args=(stage, ctx, 1))
    worker.start()
    seen = []
    while worker.is_alive() or len(seen) < 2:
        counts = corpus_status(Corpus(str(root)), cfg)["stages"]["download"]
        assert counts["upstream"] == 62 == counts["done"] + counts["final"] + counts["todo"]
        seen.append(counts["done"] + counts["final"])
        with read:
            reads[0] += 1
            read.notify_all()
    worker.join()
    assert seen == sorted(seen) and len({n for n in seen if 0 < n < 62}) >= 62 // gate, seen
    final = corpus_status(Corpus(str(root)), cfg)["stages"]["download"]
    assert (final["done"], final["failed"], final["todo"]) == (60, {"permanent": 1, "bad_input": 1}, 0)


def test_a_listed_file_deleted_before_it_is_read_is_read_again(tmp_path, monkeypatch):
    import pipeline.compose.status as status_module

    root = tmp_path / "corpus"
    expected = build(root)
    real, calls = status_module.key_sets, []

    def flaky_key_sets(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise FileNotFoundError("c-0000.parquet")
        return real(*args, **kwargs)

    monkeypatch.setattr(status_module, "key_sets", flaky_key_sets)
    from pipeline.config import load_config

    status = status_module.corpus_status(Corpus(str(root)), load_config(root / "config.yaml"))
    assert status["stages"] == expected and len(calls) > 1


def test_status_of_a_root_without_tables(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    (root / "config.yaml").write_text(CONFIG)
    result = vlcorpus("status", str(root), "--json")
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["partitions"] == 0
    assert status["stages"]["download"] == {"table": "downloads", "upstream": 0, "done": 0, "failed": {},
                                            "final": 0, "todo": 0}
