"""Per-partition summaries: status and the summary read them instead of the partitions' files,
and never disagree with the tables: a partition whose files changed since its summary (a kill
between a batch's commit and the summary's write) is rescanned, on a local and an S3 root."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest

from conftest import moto_s3

import stagekit
from pipeline.corpus import partsummary
from pipeline.config import parse_config
from pipeline.runner import RetryPolicy, StageContext, run_stage
from pipeline.compose.stages import context
from pipeline.compose.status import corpus_status, idle_partitions
from pipeline.corpus.storage import Corpus
from pipeline.compose.summarize_partition import store_summary
from pipeline.corpus.summary import summarize

CFG = parse_config({"name": "t", "sources": [{"type": "urls", "urls": ["http://127.0.0.1/x"]}],
                    "transcribe": {"prefer": ["manual"]}})
TESTS = Path(__file__).resolve().parents[1]


def _summarized(corpus: Corpus) -> Corpus:
    """Videos downloaded (one bad input), every partition's summary stored as a build does."""
    stagekit.make_videos(corpus, 12, extra=("bad1",), partitions=4)
    run_stage(stagekit.DOWNLOAD, StageContext(corpus, CFG, RetryPolicy(1, 0.0, 0.0)), batch_size=4)
    for label in corpus.labels():
        store_summary(context(corpus, CFG), label)
    return corpus


def add_video(corpus: Corpus, video: str) -> None:
    """One more video in its partition, in a batch of its own (as discover adds them)."""
    row = {"video_id": video, "url": f"http://127.0.0.1/{video}", "extractor": "demo", "source": "urls",
           "discovered_at": datetime(2026, 1, 2, tzinfo=UTC)}
    corpus.write_partitioned("videos", [row], f"new-{video}", done=[video])


def _from_tables(corpus: Corpus) -> tuple[dict, dict]:
    """Status and the summary with every summary gone: what the tables alone say."""
    corpus.fs.rm(corpus.path(partsummary.SUMMARY_DIR), recursive=True)
    return corpus_status(corpus, CFG, by_partition=True), summarize(corpus)


def test_status_reads_the_summaries_and_rescans_a_partition_whose_files_changed(memory_root):
    corpus = _summarized(Corpus(memory_root))
    label = corpus.labels()[0]
    path = corpus.path(partsummary.summary_path(label))
    doc = json.loads(corpus.fs.cat(path))
    done = doc["sections"]["status"]["value"]["download"]["done"]
    doc["sections"]["status"]["value"]["download"]["done"] = done + 100
    corpus.fs.pipe(path, json.dumps(doc).encode())
    # Same files as when the summary was written: its figures are taken as they are.
    read = corpus_status(corpus, CFG, by_partition=True)
    assert read["by_partition"][label]["download"]["done"] == done + 100
    new = next(v for v in (f"demo-new{i}" for i in range(100)) if corpus.partition_of(v) == label)
    add_video(corpus, new)  # the tampered summary is stale now
    status = corpus_status(corpus, CFG, by_partition=True)
    assert status["stages"]["download"]["upstream"] == 14
    assert status["by_partition"][label]["download"]["done"] == done
    assert idle_partitions(corpus, CFG, ["download"]).keys() == set(corpus.labels()) - {label}
    retried = idle_partitions(corpus, CFG, ["download"], retry_failed=True)
    assert corpus.partition_of("demo-bad1") not in retried  # --retry-failed: its failure is work
    assert not idle_partitions(corpus, CFG, ["download", "transcribe"])  # nothing is transcribed
    assert (status, summarize(corpus)) == _from_tables(corpus)


def test_a_partition_without_files_has_nothing_to_do_without_a_summary(memory_root):
    corpus = Corpus(memory_root)
    corpus.init_partitions(4)
    add_video(corpus, "demo-one")  # discover put one video in one partition: no summary anywhere
    idle = idle_partitions(corpus, CFG, ["download", "transcribe"])
    assert sorted(idle) == sorted(set(corpus.labels()) - {corpus.partition_of("demo-one")})
    assert {c.table for counts in idle.values() for c in counts.values()} == {"downloads", "segments"}
    assert all(c.upstream == c.done == c.todo == 0 for counts in idle.values() for c in counts.values())


def test_a_local_roots_files_are_listed_as_fsspec_lists_them(tmp_path, monkeypatch):
    """A local root is walked with os.scandir, not fsspec's find: the same files, sizes and
    versions, so the same fingerprints, and the summaries stored stay fresh."""
    from concurrent.futures import ThreadPoolExecutor

    corpus = _summarized(Corpus(str(tmp_path / "corpus")))
    with ThreadPoolExecutor(4) as pool:
        walked = partsummary.fingerprints(corpus, pool)
        with monkeypatch.context() as fsspec_only:
            fsspec_only.setattr(Corpus, "is_local", property(lambda self: False))
            assert partsummary.fingerprints(corpus, pool) == walked
            assert [partsummary.fingerprint(corpus, label) for label in corpus.labels()] == \
                [walked[label] for label in corpus.labels()]
    assert [partsummary.fingerprint(corpus, label) for label in corpus.labels()] == \
        [walked[label] for label in corpus.labels()]
    assert len(idle_partitions(corpus, CFG, ["download"])) == len(corpus.labels())


def test_a_kill_between_a_batch_and_its_partitions_summary_leaves_no_wrong_figure(tmp_path):
    corpus = _summarized(Corpus(str(tmp_path / "corpus")))
    before = summarize(corpus)
    # A build's task: it commits a partition's new download, and is killed before the
    # partition's summary is stored (what store_summary would do next).
    script = textwrap.dedent(f"""
        import os, signal
        import stagekit
        from pipeline.runner import RetryPolicy, StageContext, run_partition
        from pipeline.corpus.storage import Corpus
        from test_partsummary import add_video
        corpus = Corpus({corpus.url!r})
        add_video(corpus, "demo-late1")
        ctx = StageContext(corpus, None, RetryPolicy(1, 0.0, 0.0))
        run_partition(stagekit.DOWNLOAD, ctx, corpus.partition_of("demo-late1"), batch_size=4)
        os.kill(os.getpid(), signal.SIGKILL)
        """)
    path = [str(TESTS), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    killed = subprocess.run([sys.executable, "-c", script], env=env, timeout=120)
    assert killed.returncode == -signal.SIGKILL
    status, summary = corpus_status(corpus, CFG, by_partition=True), summarize(corpus)
    assert summary["tables"]["downloads"] == before["tables"]["downloads"] + 1
    assert status["stages"]["download"]["done"] == 13 and status["stages"]["download"]["todo"] == 0
    late = corpus.partition_of("demo-late1")
    assert late not in idle_partitions(corpus, CFG, ["download"])  # stale: a build looks again
    assert (status, summary) == _from_tables(corpus)


@pytest.mark.slow
def test_an_s3_roots_summaries_match_its_listing(tmp_path):
    with moto_s3() as endpoint:
        import s3fs

        options = {"endpoint_url": endpoint, "key": "test", "secret": "test"}
        bucket = f"corpora-{uuid.uuid4().hex[:8]}"
        s3fs.S3FileSystem(**options).mkdir(bucket)
        corpus = _summarized(Corpus(f"s3://{bucket}/c", storage_options=options))
        with partsummary.ThreadPoolExecutor(4) as pool:
            every = partsummary.fingerprints(corpus, pool)
        assert every == {label: partsummary.fingerprint(corpus, label) for label in every}
        assert sorted(idle_partitions(corpus, CFG, ["download"])) == corpus.labels()
        assert corpus_status(corpus, CFG, by_partition=True) == _from_tables(corpus)[0]

