"""A build's own start and end, as a user runs `vlcorpus build`: it reports its set-up time
apart from its work, its temporary Prefect server keeps nothing in Prefect's home but the empty
database it copies, and whatever way it ends (done, refused, SIGKILLed), none of the processes
it started (Prefect's temporary server, the workers' fork server, the Dask workers) outlives it,
and the next build removes what a killed one left on disk."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

from conftest import ROOT, SCRIPT, own_prefect_server, require_binaries, vlcorpus

pytestmark = pytest.mark.slow  # every test here starts real builds


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """Two narrated demo videos with captions, served on 127.0.0.1, and their URL list."""
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    from pipeline.demo import make_demo_media, serve_demo

    folder = tmp_path_factory.mktemp("site")
    make_demo_media(folder, n_videos=2, seed=1, quiet=True)
    with serve_demo(folder):
        yield folder / "urls.txt"


@pytest.fixture(scope="module")
def signals_server():
    """One Prefect server for both signal tests (a server's start costs seconds of CPU)."""
    with own_prefect_server() as server:
        yield server


@pytest.fixture
def signals_api(signals_server):
    """The module's server as this test's Prefect API; the test reads only the runs its build
    made."""
    from flows.services import use_api

    with use_api(signals_server.api_url):
        yield signals_server


def _config(tmp_path: Path, urls: Path, extra: str = "") -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(f"name: startup\nroot: corpus\nsources:\n  - {{type: list, path: {urls}}}\n"
                    "download: {subtitle_langs: [en], rate_limit: null, per_host: null}\n"
                    f"transcribe: {{prefer: [manual]}}\n{extra}")
    return path


def _start(config: Path, mark: str, *args: str, first: bool = False, temp: Path | None = None) -> subprocess.Popen:
    """`vlcorpus build CONFIG` as a user types it, its every process carrying ``mark`` in its
    environment. ``first``: the machine's first build, in a new Prefect home beside the config,
    by a user whose environment turns Prefect's migrations off (its server's new database is
    migrated all the same); otherwise the session's home, which holds the migrated template as
    after any first build (migrating costs a server 5 CPU-s more). ``temp``: the build's
    temporary folder (TMPDIR), where its server's database folder goes."""
    first_home = {"PREFECT_HOME": str(config.parent / "prefect-home"),
                  "PREFECT_API_DATABASE_MIGRATE_ON_START": "false"} if first else {}
    own_temp = {"TMPDIR": str(temp)} if temp else {}
    return subprocess.Popen([SCRIPT, "build", str(config), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=config.parent,
                            env={**os.environ, "VLCORPUS_TEST_MARK": mark, **first_home, **own_temp})


def _marked(mark: str) -> list[str]:
    """The live processes with ``mark`` in their environment: what a build left behind."""
    found = []
    for process in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if process.info["status"] != psutil.STATUS_ZOMBIE and \
                    process.environ().get("VLCORPUS_TEST_MARK") == mark:
                found.append(f"{process.info['pid']}: {' '.join(process.info['cmdline'] or [])[:120]}")
        except psutil.Error:
            continue
    return found


def _wait_none_left(mark: str) -> None:
    """Until no process with ``mark`` is left (those a killed build started end by themselves:
    the server looks for its parent once a second, the workers see their pipes close). One that
    never ends is a hang, for pytest-timeout, whose report shows what was left last."""
    shown = None
    while left := _marked(mark):
        if left != shown:
            print("still running:", *left, sep="\n  ", flush=True)
            shown = left
        time.sleep(0.2)


def test_a_build_reports_its_setup_apart_from_its_work_and_leaves_no_process(tmp_path, site):
    mark = uuid.uuid4().hex
    build = _start(_config(tmp_path, site), mark, "--json", first=True)
    out, err = build.communicate(timeout=300)
    assert build.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    timing = summary["timing"]
    assert timing["work_started_at"] < timing["work_ended_at"]
    assert timing["setup_s"] > 0 and timing["work_s"] > 0
    assert summary["tables"]["clips"] > 0
    # Its processes ended before it did: it stops and waits for each.
    assert _marked(mark) == []
    # The server's database went with it; the migrated empty one stays for the next build.
    assert [p.name for p in (tmp_path / "prefect-home").iterdir()] == [
        f"vlcorpus-empty-{importlib.metadata.version('prefect')}.db"]


def test_a_build_killed_outright_leaves_no_process_and_the_next_build_removes_its_folder(tmp_path, site,
                                                                                        monkeypatch, short_tmp):
    """SIGKILLed, a build runs no exit handler: its processes stop by themselves, and the folder
    of its temporary server's database stays until the next build's server starts, which
    removes it and the folders of other builds that are gone, never one of a live build. The
    build and the next one (this process's) have a temporary folder of their own: a build of
    another test, started meanwhile in /tmp, would be the next build and remove the folder."""
    from flows.temporary_server import FOLDER_PREFIX, TemporaryServer, _host_key, _owned_prefix

    monkeypatch.setattr(tempfile, "tempdir", str(short_tmp))
    mark = uuid.uuid4().hex
    build = _start(_config(tmp_path, site), mark, temp=short_tmp)
    deadline = time.monotonic() + 120
    # Killed once its server and workers are up: the root's first table is discover's.
    while not (tmp_path / "corpus" / "videos").exists() and build.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert build.poll() is None, build.stderr.read()[-3000:]
    build.send_signal(signal.SIGKILL)
    build.wait()
    _wait_none_left(mark)
    (left,) = Path(tempfile.gettempdir()).glob(f"{FOLDER_PREFIX}{build.pid}-*")
    me = _owned_prefix()  # this process's, alive
    pid, started = me.removeprefix(FOLDER_PREFIX).split("-")[:2]
    kept = [Path(tempfile.mkdtemp(prefix=prefix)) for prefix in (
        me, f"{FOLDER_PREFIX}{pid}-{int(started) - 12345}-ffffffff-",  # on another host
        "vlcorpus-prefect-")]  # an older build's: whose, it does not say
    reused = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{pid}-{int(started) - 12345}-{_host_key()}-"))
    TemporaryServer().stop()  # the next build's
    assert not left.exists() and not reused.exists()  # its pid names a process started later
    assert all(folder.exists() for folder in kept)


def test_a_refused_build_starts_nothing_and_writes_nothing(tmp_path):
    mark = uuid.uuid4().hex
    config = _config(tmp_path, tmp_path / "urls.txt", "features:\n  extractors:\n"
                     "    - {name: resnet34, weights: /nowhere/resnet34.pth}\n")
    build = _start(config, mark)
    out, err = build.communicate(timeout=120)
    assert build.returncode == 2
    assert "/nowhere/resnet34.pth" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "corpus").exists()
    assert _marked(mark) == []


def test_the_module_entry_point_is_the_script(tmp_path):
    """`python -m pipeline.cli` runs what the `vlcorpus` script runs, exit codes included."""
    done = vlcorpus("build", str(tmp_path / "none.yaml"), cwd=ROOT, timeout=60)
    assert done.returncode == 2 and "does not exist" in done.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_build_stopped_by_a_signal_ends_its_run_crashed_and_releases_the_root(tmp_path, site, signals_api, signum):
    """SIGTERM (as `timeout` sends it) or Ctrl-C in the middle of a build: it exits with the
    signal's code (not its work done), its flow run ends Crashed (or Cancelled), the root's lock
    is gone and no process is left."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        earlier = {run.id for run in client.read_flow_runs()}  # the other signal's build
    mark = uuid.uuid4().hex
    build = _start(_config(tmp_path, site), mark)
    deadline = time.monotonic() + 180
    while not (tmp_path / "corpus" / "videos").exists() and build.poll() is None and \
            time.monotonic() < deadline:
        time.sleep(0.1)
    assert build.poll() is None, build.stderr.read()[-3000:]
    build.send_signal(signum)
    _, err = build.communicate()
    assert build.returncode in (128 + signum, 1, 130), err[-3000:]
    # Unwound, not ended by the hard exit of a stop that hung (GRACE_S), which its log would say.
    log = "".join(p.read_text() for p in (tmp_path / "corpus" / "logs").glob("build-*.log"))
    assert log and "exiting now" not in log, log[-3000:]
    assert not (tmp_path / "corpus" / "_lock.json").exists()
    _wait_none_left(mark)
    with get_client(sync_client=True) as client:
        states = [run.state.type.value for run in client.read_flow_runs() if run.id not in earlier]
    assert states and set(states) <= {"CRASHED", "CANCELLED"}, states


def test_the_checks_load_their_models_in_a_process_of_their_own(tmp_path):
    """`vlcorpus build`'s setup checks build each extractor's model in a new interpreter: the
    command's process, which runs the flow for the whole build, never imports torch; their log
    records are its own, a missing weights file its SetupError."""
    probe = (
        "import json, logging, sys\n"
        "from pipeline.compose.checks import ChecksApart\n"
        "from pipeline.config import parse_config\n"
        "from pipeline.errors import SetupError\n"
        "from pipeline.progress import log\n"
        "said = []\n"
        "log.addHandler(type('H', (logging.Handler,), {'emit': lambda self, r: said.append(r.getMessage())})())\n"
        "log.setLevel(logging.INFO)\n"
        "def config(weights):\n"
        "    return parse_config({'name': 'c', 'sources': [{'type': 'urls', 'urls': ['http://127.0.0.1:9/x']}],\n"
        "                         'transcribe': {'prefer': ['manual']},\n"
        "                         'features': {'extractors': [{'name': 'resnet34', 'weights': weights}]}})\n"
        "ChecksApart(config('none'), until='featurize').wait()\n"
        f"try:\n    ChecksApart(config({str(tmp_path / 'missing.pth')!r}), until='featurize').wait()\n"
        "except SetupError as exc:\n    said.append(f'SetupError: {exc}')\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'said': said}))\n")
    done = subprocess.run([str(Path(SCRIPT).with_name("python")), "-c", probe], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.splitlines()[-1])
    assert answer["torch"] is False
    assert any(line.startswith("resnet34: weights none: random initialisation") for line in answer["said"])
    assert any(line.startswith("SetupError: ") and "missing.pth" in line for line in answer["said"]), answer
