"""A run killed with SIGKILL in the middle of a stage and rerun equals one clean run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from conftest import TESTS
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

SCRIPT = """
import os
import sys
import stagekit
from pipeline.runner import RetryPolicy, StageContext, run_stage
from pipeline.corpus.storage import Corpus
ctx = StageContext(Corpus(sys.argv[1]), None, RetryPolicy(2, 0, 0))
if not ctx.corpus.table_files("videos"):
    stagekit.make_videos(ctx.corpus, 24, extra=("bad1", "gone1", "silent1"))
run_stage(stagekit.DOWNLOAD, ctx, batch_size=4)
run_stage(stagekit.TRANSCRIBE, ctx, batch_size=4)
# Ended as vlcorpus's entry point ends (pipeline/launch.py), before the interpreter's teardown,
# where Arrow's thread pools now and then abort the process (apache/arrow#34314).
sys.stderr.flush()
os._exit(0)
"""


def _run(root: Path, delay: float = 0.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(TESTS), "VLC_TEST_DELAY": str(delay)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(root)], env=env)


def _snapshot(root: Path) -> dict[str, list[dict]]:
    corpus = Corpus(str(root))
    tables = {}
    for name in corpus.tables():
        data = corpus.read(name)
        if name == "errors":
            data = data.drop_columns(["time"])
        tables[name] = sorted(data.to_pylist(), key=repr)
    return tables


def _wait_for_files(directory: Path, n: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if directory.exists() and len([p for p in directory.glob("partition=*/*.parquet")
                                       if not p.name.startswith(".")]) >= n:
            return
        if proc.poll() is not None:
            pytest.fail("the run ended before it could be killed")
        time.sleep(0.01)
    pytest.fail(f"no {n} batches in {directory} after 60 s")


@pytest.mark.parametrize("table,batches", [("downloads", 2), ("segments", 3)])
def test_sigkill_mid_stage_then_rerun_equals_clean_run(tmp_path, table, batches):
    clean = tmp_path / "clean"
    assert _run(clean).wait(timeout=120) == 0

    killed = tmp_path / "killed"
    proc = _run(killed, delay=0.05)
    _wait_for_files(killed / table, batches, proc)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    partial = Corpus(str(killed))
    assert len(partial.done(table)) < len(Corpus(str(clean)).done(table))

    assert _run(killed).wait(timeout=120) == 0
    assert _snapshot(killed) == _snapshot(clean)
    assert validate(Corpus(str(killed))) == []
    for directory in (killed / "downloads", killed / "segments", killed / "errors"):
        assert not [p for p in directory.rglob(".tmp-*")]


def test_snapshot_sees_differences(tmp_path):
    """Guard for the comparison above: a changed row must show."""
    root = tmp_path / "r"
    assert _run(root).wait(timeout=120) == 0
    before = _snapshot(root)
    corpus = Corpus(str(root))
    data = corpus.read("segments").slice(0, 1)
    text = data.set_column(data.schema.get_field_index("text"), "text", pa.array(["changed"]))
    video = text.column("video_id")[0].as_py()
    corpus.write_batch("segments", text, "extra", corpus.partition_of(video), done=[video])
    assert _snapshot(root) != before
