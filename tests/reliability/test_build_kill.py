"""SIGKILL `vlcorpus build` (the whole process group: flow, Prefect server, Dask workers) at
several points of a demo build, then rerun: tables and shards equal one clean build, and
`vlcorpus validate` passes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.demo import serve_demo
from pipeline.corpus.storage import Corpus

pytestmark = pytest.mark.slow
VOLATILE = {"discovered_at", "downloaded_at", "released_at", "time"}


def _config(path: Path, urls: Path) -> Path:
    path.write_text(yaml.safe_dump({
        "name": "killtest",
        "sources": [{"type": "list", "path": str(urls)}],
        "download": {"subtitle_langs": ["en", "en-auto"]},
        "transcribe": {"prefer": ["manual"]},
        "features": {"extractors": [{"name": "resnet34", "fps": 1, "weights": "none"}],
                     "clips_per_commit": 3},
        "shards": {"samples_per_shard": 5},
        "execution": {"batch_size": 1, "n_workers": 1, "retry_backoff_s": 0},
    }))
    return path


def _build(config: Path, root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pipeline.cli", "build", str(config),
                             "--root", str(root), "--quiet"],
                            start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _committed(folder: Path) -> int:
    if not folder.exists():
        return 0
    return sum(1 for p in folder.rglob("*") if p.suffix in (".parquet", ".tar")
               and not p.name.startswith("."))


def _kill_when(proc: subprocess.Popen, folder: Path) -> bool:
    """SIGKILL the build's process group once ``folder`` has a committed file; False when the
    build ended first."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if _committed(folder):
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return True
        time.sleep(0.05)
    proc.wait()
    return False


def _tables(root: Path) -> dict[str, list]:
    corpus = Corpus(str(root))
    out = {}
    for table in corpus.tables():
        data = corpus.read(table)
        keep = [c for c in data.column_names if c not in VOLATILE]
        out[table] = sorted(data.select(keep).to_pylist(), key=repr)
    return out


def _shards(root: Path) -> dict[str, object]:
    index = json.loads((root / "shards" / "webdataset" / "index.json").read_text())
    parquet = json.loads((root / "shards" / "parquet" / "index.json").read_text())
    return {"webdataset": sorted((s["name"], s["sha256"], s["count"]) for s in index["shards"]),
            "parquet": sorted((s["name"], s["sha256"], s["count"]) for s in parquet["shards"])}


def test_sigkill_at_several_points_then_rerun_equals_clean_build(demo_corpus, tmp_path):
    _, site = demo_corpus
    with serve_demo(site) as base:
        urls = tmp_path / "urls.txt"
        urls.write_text("".join(f"{base}pages/{p}\n"
                                for p in ("tour-0.html", "tour-1.html", "gone.html")))
        config = _config(tmp_path / "build.yaml", urls)
        clean = tmp_path / "clean"
        proc = _build(config, clean)
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]

        killed = tmp_path / "killed"
        kills = []
        for folder in ("downloads", "segments", "features/resnet34", "shards/webdataset"):
            proc = _build(config, killed)
            if _kill_when(proc, killed / folder):
                kills.append(folder)
        assert len(kills) >= 3, kills
        proc = _build(config, killed)
        assert proc.wait(timeout=600) == 0, proc.stderr.read()[-3000:]

    assert _tables(killed) == _tables(clean)
    assert _shards(killed) == _shards(clean)
    for name, sha, _ in _shards(clean)["webdataset"]:
        assert (killed / "shards" / "webdataset" / name).read_bytes() == \
            (clean / "shards" / "webdataset" / name).read_bytes(), sha
    result = subprocess.run([sys.executable, "-m", "pipeline.cli", "validate", str(killed)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
