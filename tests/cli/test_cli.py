"""The stable command line: config errors before any work, validate's exit codes, a root that
does not exist, commands that are not built yet, stats as JSON, the demo site made and served."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

import stagekit
import trainkit
from conftest import require_binaries, vlcorpus
from pipeline.runner import RetryPolicy, StageContext, run_stage
from pipeline.corpus.storage import Corpus


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


@pytest.mark.parametrize("command", ["build", "train"])
def test_a_config_without_a_root_is_one_line(tmp_path, command):
    config = tmp_path / "rootless.yaml"
    config.write_text("name: rootless\nsources:\n  - type: urls\n    urls: [http://127.0.0.1/x]\n")
    result = vlcorpus(command, str(config), env={**os.environ, "VLCORPUS_ROOT": ""})
    assert result.returncode == 2, result.stderr
    assert " ".join(result.stderr.split()) == (
        "config 'rootless' has no corpus root: pass --root, set `root:` in it, or set VLCORPUS_ROOT "
        "(the corpus is then $VLCORPUS_ROOT/rootless)")


@pytest.mark.slow
def test_setup_is_checked_before_any_download(tmp_path):
    """ASR in transcribe.prefer with a model that is nowhere: one line, exit 2, nothing fetched."""
    config = tmp_path / "asr.yaml"
    root = tmp_path / "root"
    config.write_text(f"name: asr\nroot: {root}\nsources:\n  - type: urls\n"
                      "    urls: [http://127.0.0.1:9/x.html]\n"
                      "transcribe:\n  asr: {model: /no/such/whisper-model}\n")
    result = vlcorpus("build", str(config), "--quiet")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "faster-whisper model directory '/no/such/whisper-model' does not exist")
    assert "Traceback" not in result.stderr
    assert not (root / "videos").exists() and not (root / "media").exists()


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
    assert ok.returncode == 0 and "valid" in ok.stdout
    path = corpus.table_files("downloads")[0]
    table = pq.read_table(path)
    victim = table.column("video_id")[0].as_py()
    pq.write_table(table.slice(1), path)
    bad = vlcorpus("validate", corpus.url, "--json")
    assert bad.returncode == 1
    report = json.loads(bad.stdout)
    assert not report["valid"]
    assert any(v.startswith("downloads:") and repr(victim) in v for v in report["violations"])


@pytest.mark.parametrize("command", ["status", "validate", "stats", "report", "migrate"])
def test_a_root_that_does_not_exist_is_one_line_and_exit_2(tmp_path, command):
    """A typo in the path is not an empty corpus (validate once said "valid (no tables)")."""
    typo = tmp_path / "corpsu"
    result = vlcorpus(command, str(typo))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"{typo} does not exist: no corpus there (check the path)"
    assert not typo.exists()


def test_stats_json_counts_tables_and_errors(tmp_path):
    corpus = _built(tmp_path / "root")
    result = vlcorpus("stats", corpus.url, "--json")
    summary = json.loads(result.stdout)
    assert summary["tables"] == {"videos": 5, "downloads": 4, "errors": 1}
    assert summary["errors"] == {"download": {"bad_input": 1}}


@pytest.mark.slow
def test_train_and_eval_commands(tmp_path):
    root = tmp_path / "root"
    trainkit.synthetic_features(Corpus(str(root)))
    config = tmp_path / "train.yaml"
    config.write_text(
        f"name: syn\nroot: {root}\nsources:\n  - type: urls\n    urls: [http://127.0.0.1/x]\n"
        "features:\n  extractors:\n    - {name: resnet34, fps: 2, weights: none}\n"
        "    - {name: 'text:x'}\n"
        "train: {model: nce, visual: resnet34, text: 'text:x', epochs: 8, batch_size: 32,\n"
        "        embed_dim: 32, lr: 0.003, temperature: 0.1}\n")
    trained = vlcorpus("train", str(config))
    assert trained.returncode == 0, trained.stderr[-2000:]
    metrics = json.loads(trained.stdout.strip().splitlines()[-1])
    assert metrics["t2v"]["R@1"] > 3 * 100 / 30  # 30 test pairs: random R@1 is 3.3 %
    assert (root / "train" / "nce" / "metrics.json").exists()
    assert (root / "train" / "nce" / "curve.png").stat().st_size > 1000
    evaluated = vlcorpus("eval", str(config))
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    again = json.loads(evaluated.stdout.strip().splitlines()[-1])
    assert again["t2v"]["R@1"] == metrics["t2v"]["R@1"]
    missing = vlcorpus("eval", str(config), "--checkpoint", str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "no checkpoint" in missing.stderr


@pytest.mark.slow
def test_demo_site_make_then_serve(tmp_path):
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    site = tmp_path / "site"
    made = vlcorpus("demo-site", "make", str(site), "--videos", "1", "--seed", "3", "--quiet")
    assert made.returncode == 0, made.stderr[-2000:]
    assert made.stdout == f"wrote 1 videos and 2 bad pages to {site}\n"
    server = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "demo-site", "serve", str(site)],
                              stdout=subprocess.PIPE, text=True)
    try:
        base_url = server.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/", base_url), server.poll()
        with urllib.request.urlopen(base_url + "urls.txt", timeout=30) as response:
            urls = response.read().decode().splitlines()
        assert urls == [base_url + page for page in ("pages/tour-0.html", "pages/broken.html",
                                                     "pages/gone.html")]
        with urllib.request.urlopen(urls[0], timeout=30) as response:
            assert b'<source src="../media/tour-0.mp4" type="video/mp4">' in response.read()
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_build_output_says_why_a_stage_stopped(capsys):
    from pipeline.cli import _emit

    stopped = "downloads stopped: the site has refused this session for 61 min ... or wait"
    _emit({"root": "r", "tables": {}, "errors": {}, "stages": {
        "download": {"ok": 3, "stopped": stopped, "left": 9}, "transcribe": {"ok": 3}}}, "rich")
    out = capsys.readouterr().out
    assert "download: downloads stopped: the site has refused" in out and "transcribe:" not in out


def test_build_output_names_no_shard_folder_an_empty_build_never_wrote_and_ends_with_its_time(capsys):
    from pipeline.cli import _emit

    empty = {"webdataset": {"written": 0, "shards": 0, "samples": 0},
             "parquet": {"written": 0, "shards": 0, "samples": 0}}
    _emit({"root": "r", "tables": {}, "errors": {}, "stages": {"shard": empty},
           "timing": {"site_s": 40.0, "setup_s": 3.25, "work_s": 11.2}}, "rich")
    lines = capsys.readouterr().out.strip().splitlines()
    assert "shards: none, no clip to shard yet" in lines and not any("shards/" in line for line in lines)
    assert lines[-1] == ("time: 40.0 s making the demo site, 3.2 s to start (Prefect server, Dask cluster), "
                         "11.2 s of work")


@pytest.mark.slow
def test_a_dead_source_fails_the_build_and_config_paths_are_read_beside_the_config(tmp_path):
    """Run from another folder: the config's relative root and list are beside the config. A
    list that is not there yet: the build commits its errors row, says why it is unhealthy,
    exits 1; once the list is there, the same command builds and exits 0."""
    configs, elsewhere = tmp_path / "configs", tmp_path / "elsewhere"
    configs.mkdir()
    elsewhere.mkdir()
    config = configs / "dead.yaml"
    config.write_text("name: dead\nroot: r2\nsources:\n  - type: list\n    path: urls.txt\n"
                      "execution: {n_workers: 1}\n")
    args = ("build", "../configs/dead.yaml", "--until", "discover", "--json")
    failed = vlcorpus(*args, cwd=elsewhere)
    assert failed.returncode == 1, failed.stderr[-2000:]
    summary = json.loads(failed.stdout.strip().splitlines()[-1])
    root = configs / "r2"
    assert summary["root"] == str(root) and not (elsewhere / "r2").exists()
    assert summary["errors"] == {"discover": {"bad_input": 1}}
    assert not summary["health"]["healthy"]
    message = summary["health"]["message"]
    assert message.split(":")[0] == f"The build of {root} is unhealthy"
    assert " ".join(failed.stderr.split()).endswith(message)
    assert "the sources listed 0 videos (at least 1 expected; 1 of 1 queries failed)" in message
    assert str(configs / "urls.txt") in Corpus(str(root)).read("errors").column("message")[0].as_py()

    (configs / "urls.txt").write_text("http://127.0.0.1:9/a.mp4\nhttp://127.0.0.1:9/b.mp4\n")
    healthy = vlcorpus(*args[:-1], cwd=elsewhere)  # the summary as tables, into a pipe
    assert healthy.returncode == 0, healthy.stderr[-2000:]
    lines = healthy.stdout.splitlines()
    assert f"corpus {root}" in lines  # a path is never wrapped mid-word
    assert any(re.fullmatch(r"│ videos +│ +2 │", line) for line in lines), healthy.stdout
