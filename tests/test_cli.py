"""The stable command line: config errors before any work, validate's exit codes,
commands that are not built yet, stats as JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

import stagekit
from pipeline.runner import RetryPolicy, StageContext, run_stage
from pipeline.storage import Corpus


def vlcorpus(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def test_typo_and_wrong_type_fail_before_any_work(tmp_path):
    config = tmp_path / "bad.yaml"
    root = tmp_path / "root"
    config.write_text(
        f"name: bad\nroot: {root}\nsources:\n  - type: urls\n    urls: [http://127.0.0.1/x]\n"
        "download:\n  formt: best\nexecution:\n  batch_size: many\n")
    result = vlcorpus("build", str(config))
    assert result.returncode == 2
    assert "download.formt: unknown key" in result.stderr and "format" in result.stderr
    assert "execution.batch_size" in result.stderr
    assert not root.exists()  # nothing was started


def test_unknown_until_stage_is_refused(tmp_path):
    config = tmp_path / "ok.yaml"
    config.write_text("name: ok\nsources:\n  - type: urls\n    urls: [http://127.0.0.1/x]\n")
    result = vlcorpus("build", str(config), "--until", "featurise", "--root", str(tmp_path / "r"))
    assert result.returncode == 2 and "unknown stage 'featurise'" in result.stderr


def _built(root: Path) -> Corpus:
    ctx = StageContext(Corpus(str(root)), None, RetryPolicy(1, 0, 0))
    stagekit.make_videos(ctx.corpus, 4, extra=("bad1",))
    run_stage(stagekit.DOWNLOAD, ctx, batch_size=2)
    return ctx.corpus


def test_validate_passes_then_names_table_and_key(tmp_path):
    corpus = _built(tmp_path / "root")
    ok = vlcorpus("validate", corpus.url)
    assert ok.returncode == 0 and "valid" in ok.stderr
    path = corpus.table_files("downloads")[0]
    table = pq.read_table(path)
    victim = table.column("video_id")[0].as_py()
    pq.write_table(table.slice(1), path)
    bad = vlcorpus("validate", corpus.url, "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert not report["valid"]
    assert any(v.startswith("downloads:") and repr(victim) in v for v in report["violations"])


def test_stats_json_counts_tables_and_errors(tmp_path):
    corpus = _built(tmp_path / "root")
    result = vlcorpus("stats", corpus.url, "--json")
    summary = json.loads(result.stdout)
    assert summary["tables"] == {"videos": 5, "downloads": 4, "errors": 1}
    assert summary["errors"] == {"download": {"bad_input": 1}}


def test_commands_not_built_yet_say_so_and_exit_2(tmp_path):
    for args in (["train", str(tmp_path)], ["eval", str(tmp_path)]):
        result = vlcorpus(*args)
        assert result.returncode == 2 and "not built yet" in result.stderr
