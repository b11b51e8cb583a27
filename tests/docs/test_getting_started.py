"""docs/getting-started.md as a newcomer follows it: every command of its shell blocks runs as
written, in page order, in a folder with the repository's configs and virtualenv, and the
files it shows (``title="..."``) are written as shown. Two things differ, each where the page
could not be followed offline or in a few minutes: ``make demo`` runs the command its recipe
runs with 3 videos instead of 12, and the YouTube ids and URL template of the own-corpus section
point at the demo's site on 127.0.0.1 instead. ``make test`` is the suite this test is part of:
only its recipe is checked. A ``pip install`` runs with ``--dry-run --no-deps``, and what it
would install is checked against the constraints and the suite's venv (``_pip_install_checked``).
Then the Python blocks of docs/outputs.md run on the demo's corpus, as
written, in page order and in one process, as a reader pastes them into one session.

Last, the demo itself (``vlcorpus demo``: generated site, Prefect flow on a local multi-process
Dask cluster, summary): its corpus is valid and holds what the page says; damaged shards are
named by `vlcorpus validate`; ``make demo``'s command run again resumes, changes no table and
writes those shards again. One demo build serves the page and these checks: each costs about
half a CPU-minute."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml
from conftest import locked_pins, require_binaries
from docskit import DOCS, ROOT, code_blocks, commands
from sitekit import port_for_splits

from pipeline.corpus.storage import Corpus
from pipeline.corpus.validate import validate
from pipeline.demo.model import DemoSite
from pipeline.demo.serve import serve_demo

pytestmark = pytest.mark.slow

PAGE = DOCS / "getting-started.md"
OUTPUTS = DOCS / "outputs.md"
YOUTUBE = "https://www.youtube.com/watch?v={id}"
DEMO_VIDEOS = 3


def _recipe(target: str) -> list[str]:
    """What ``make TARGET`` would run (make -n: nothing runs, not even the install)."""
    shown = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.splitlines()


def _demo_port() -> int:
    """A free port on which two of the demo's videos fall in its train split and one in test:
    what training needs at least."""
    splits = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())["align"]["splits"]
    return port_for_splits([f"pages/tour-{i}.html" for i in range(DEMO_VIDEOS)], splits,
                           {"train": 2, "test": 1})


def _run(command: str, cwd: Path, env: dict[str, str], code: int = 0) -> subprocess.CompletedProcess:
    done = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == code, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def _pip_install_checked(command: str, work: Path, env: dict[str, str]) -> None:
    """The page's ``pip install -c constraints.txt '.[EXTRAS]'`` with ``--dry-run --no-deps``: pip
    reads the command and builds the project's metadata with those extras. Resolving their
    requirements from the constraints is what ``make venv`` did with pip before this suite ran,
    for a superset of extras (dev); so each requirement is checked to be pinned there, and
    installed at its pin in the suite's venv. A full resolve of the page's command took pip 35
    CPU-s alone and 60 in the suite, more than any other single command."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version

    report = work / "pip-report.json"
    _run(command.replace("/pip install ", f"/pip install --dry-run --no-deps --quiet --report {report} ", 1),
         work, env)
    (project,) = json.loads(report.read_text())["install"]
    extras = project["requested_extras"]
    assert extras and set(extras) <= set(project["metadata"]["provides_extra"]), extras
    pins = locked_pins((work / "constraints.txt").read_text())
    wanted = [Requirement(r) for r in project["metadata"]["requires_dist"]]
    wanted = {canonicalize_name(r.name) for r in wanted
              if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ["", *extras])}
    assert {"torch", "faster-whisper"} <= wanted and not wanted - set(pins), sorted(wanted - set(pins))
    installed = {name: Version(importlib.metadata.version(name)).public for name in wanted}
    assert installed == {name: pins[name] for name in wanted}


def test_every_getting_started_command_runs_as_written(tmp_path):
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    work = tmp_path / "repo"
    work.mkdir()
    shutil.copytree(ROOT / "configs", work / "configs")
    (work / ".venv").symlink_to(ROOT / ".venv")
    for name in ("pyproject.toml", "README.md", "constraints.txt", "uv.lock", "pipeline", "flows", "schemas"):
        (work / name).symlink_to(ROOT / name)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")}
    ran: list[str] = []
    site: dict[str, str] = {}  # the stand-in for YouTube, once the demo made it
    with ExitStack() as stack:
        for block in code_blocks(PAGE):
            if block.title:
                text = block.text.replace(YOUTUBE, site["template"])
                if block.title.endswith(".txt"):  # the ids
                    text = "".join(f"{v}\n" for v in site["ids"].split())
                (work / block.title).write_text(text)
                continue
            if block.language == "python":
                _run(f".venv/bin/python - <<'PY'\n{block.text}PY", work, env)
                ran.append(block.text)
            if block.language != "sh":
                continue
            for command in commands(block):
                ran.append(command)
                if command == "make test":
                    assert any("pytest" in line for line in _recipe("test"))
                elif command == "make demo":
                    [demo] = [line for line in _recipe("demo") if " demo --root " in line]
                    demo += f" --videos {DEMO_VIDEOS} --port {_demo_port()}"
                    _run(f"{demo} --quiet", work, env)
                    pages = work / "demo-corpus" / "site"
                    site["template"] = stack.enter_context(serve_demo(pages)) + "pages/{id}.html"
                    site["ids"] = " ".join(v.id for v in DemoSite.load(pages).videos)
                elif "/pip install " in command:
                    _pip_install_checked(command, work, env)
                else:
                    _run(command, work, env)
    assert {"make demo", "make test", ".venv/bin/vlcorpus build my_tours.yaml",
            ".venv-mine/bin/pip install -c constraints.txt '.[features,asr]'"} <= set(ran)
    assert (work / "demo-corpus" / "corpus" / "train" / "wal" / "metrics.json").exists()
    readers = "".join(b.text for b in code_blocks(OUTPUTS) if b.language == "python")
    _run(f".venv/bin/python - <<'PY'\n{readers}PY", work, env)
    assert list((work / "my_tours-corpus" / "shards" / "parquet").glob("split=*/*.parquet"))
    _demo_is_valid_and_resumes(work, demo, env)


def _demo_is_valid_and_resumes(work: Path, demo: str, env: dict[str, str]) -> None:
    """The demo's corpus after the page, then ``make demo``'s command again (same port: generic
    video ids include the page URL)."""
    root = work / "demo-corpus" / "corpus"
    corpus = Corpus(str(root))
    before = {t: corpus.read(t).num_rows for t in corpus.tables()}
    # The videos, plus the page whose media is truncated and the one that 404s.
    assert before["videos"] == DEMO_VIDEOS + 2 and before["downloads"] == DEMO_VIDEOS
    assert before["segments"] > DEMO_VIDEOS
    errors = Counter((e["stage"], e["kind"]) for e in corpus.read("errors").to_pylist())
    assert errors == {("download", "bad_input"): 1, ("download", "permanent"): 1}
    assert validate(corpus) == []

    # A shard overwritten with garbage and one deleted: validate names both on stdout and exits
    # 1, status no longer counts their clips as sharded, and the second run, which does nothing
    # else, writes them again.
    part = sorted((root / "shards" / "parquet").rglob("*.parquet"))[0]
    tar = sorted((root / "shards" / "webdataset").glob("*.tar"))[-1]
    shards = {p: p.read_bytes() for p in (part, tar)}
    part.write_bytes(b"garbage" * 100)
    tar.unlink()
    checked = _run(".venv/bin/vlcorpus validate demo-corpus/corpus", work, env, code=1)
    assert f"shards/parquet/{part.relative_to(root / 'shards' / 'parquet')}: " in checked.stdout
    assert f"shards/webdataset/{tar.name}: missing" in checked.stdout
    assert "the next build writes them again" in checked.stdout
    status = json.loads(_run(".venv/bin/vlcorpus status demo-corpus/corpus --json", work, env).stdout)
    assert status["stages"]["shard"]["todo"] > 0
    again = json.loads(_run(f"{demo} --json", work, env).stdout.strip().splitlines()[-1])
    assert again["stages"]["download"]["items"] == 0 and again["stages"]["transcribe"]["items"] == 0
    assert {"site_s", "setup_s", "work_s"} <= set(again["timing"])  # the summary's time: line
    assert {t: corpus.read(t).num_rows for t in corpus.tables()} == before
    assert validate(corpus) == []
    assert all(p.read_bytes() == data for p, data in shards.items())
