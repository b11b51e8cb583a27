"""`vlcorpus demo` end to end: generated site, Prefect flow on a local multi-process Dask
cluster, summary, and a valid corpus; damaged shards are named by `vlcorpus validate`; a second
run resumes, changes no table and writes those shards again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT, require_binaries, spare_port
from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate

pytestmark = pytest.mark.slow


def _vlcorpus(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True,
                          text=True, timeout=300)


def _demo(root, port: int) -> dict:
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "demo", "--root", str(root), "--videos", "2",
         "--port", str(port), "--json"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_demo_builds_a_valid_corpus_and_resumes(tmp_path):
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    # Generic video ids include the page URL, so both runs serve on the same port.
    port = spare_port()
    first = _demo(tmp_path, port)
    assert first["tables"]["videos"] == 4  # 2 videos + the broken and the gone page
    assert first["tables"]["downloads"] == 2
    assert first["tables"]["segments"] > 4
    assert first["errors"] == {"download": {"bad_input": 1, "permanent": 1}}
    corpus = Corpus(str(tmp_path / "corpus"))
    assert validate(corpus) == []
    assert {"site_s", "setup_s", "work_s"} <= set(first["timing"])  # the summary's time: line
    # The demo config trains a model; with 2 videos the hash split may leave no test video, or
    # one video to train on, which the train stage reports instead of failing the build, in the
    # words the page quotes.
    trained = first["stages"]["train"]
    if "skipped" in trained:
        reasons = ["no pair is in the test split, and scoring the training pairs would leak",
                   "WAL negatives need pairs from at least two groups"]
        said = [r for r in reasons if r in trained["skipped"]]
        assert said and said[0] in (ROOT / "docs" / "getting-started.md").read_text(), trained["skipped"]
    else:
        assert trained["n_test"] >= 2 and 0 <= trained["t2v"]["R@1"] <= 100
        assert (tmp_path / "corpus" / "train" / "wal" / "metrics.json").exists()
    before = {t: corpus.read(t).num_rows for t in corpus.tables()}

    # A shard overwritten with garbage and one deleted: validate names both on stdout and
    # exits 1, status no longer counts their clips as sharded, and the second run, which does
    # nothing else, writes them again.
    root = tmp_path / "corpus"
    part = sorted((root / "shards" / "parquet").rglob("*.parquet"))[0]
    tar = sorted((root / "shards" / "webdataset").glob("*.tar"))[-1]
    shards = {p: p.read_bytes() for p in (part, tar)}
    part.write_bytes(b"garbage" * 100)
    tar.unlink()
    checked = _vlcorpus("validate", str(root))
    assert checked.returncode == 1
    assert f"shards/parquet/{part.relative_to(root / 'shards' / 'parquet')}: " in checked.stdout
    assert f"shards/webdataset/{tar.name}: missing" in checked.stdout
    assert "the next build writes them again" in checked.stdout
    status = json.loads(_vlcorpus("status", str(root), "--json").stdout)["stages"]["shard"]
    assert status["todo"] > 0
    second = _demo(tmp_path, port)
    assert second["stages"]["download"]["items"] == 0
    assert second["stages"]["transcribe"]["items"] == 0
    assert {t: corpus.read(t).num_rows for t in corpus.tables()} == before
    assert _vlcorpus("validate", str(root)).returncode == 0
    assert all(p.read_bytes() == data for p, data in shards.items())
