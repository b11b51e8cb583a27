from __future__ import annotations

import atexit
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import NoReturn
from contextlib import contextmanager
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SHARED_DATA = ROOT.parent / "shared" / "data"
# Test helpers (stagekit, trainkit, flakyserver, speech) import from here in every test folder.
sys.path.insert(0, str(TESTS))
# The builds a test session starts keep their Prefect database (limits, leases, variables)
# apart from the user's ~/.prefect and from other sessions; set before Prefect is imported.
# Under pytest-xdist each worker process has one of its own: the workers inherit the
# environment of the process that started them, whose home it is not theirs to share.
_OWN_HOME = "VLCORPUS_TESTS_PREFECT_HOME"
_SESSION_HOME = os.environ.get(_OWN_HOME)  # in an xdist worker: the home of the process that started it
if os.environ.get("PREFECT_HOME") in (None, _SESSION_HOME):
    os.environ["PREFECT_HOME"] = os.environ[_OWN_HOME] = tempfile.mkdtemp(
        prefix=f"vlcorpus-tests-prefect-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-")
    atexit.register(shutil.rmtree, os.environ[_OWN_HOME], ignore_errors=True)


def _share_server_template(session_home: str) -> None:
    """The migrated empty database of the builds' temporary Prefect servers
    (flows/temporary_server.py), made once for the session's workers: the first worker here makes
    it (a server started and stopped: migrating is 7 CPU-s), the others copy it into their home.
    Runs beside collection; a build that starts before it is done makes one itself, as before."""
    import fcntl

    from flows.temporary_server import TemporaryServer, _template

    own = _template()
    shared = Path(session_home) / own.name
    with open(shared.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if shared.exists():
            if not own.exists():
                shutil.copyfile(shared, own)
            return
        if not own.exists():
            server = TemporaryServer()
            server.wait()
            server.stop()
        part = shared.with_suffix(f".{os.getpid()}.part")
        shutil.copyfile(own, part)
        os.replace(part, shared)


if os.environ.get("PYTEST_XDIST_WORKER") and _SESSION_HOME and os.environ[_OWN_HOME] != _SESSION_HOME:
    threading.Thread(target=_share_server_template, args=(_SESSION_HOME,), daemon=True).start()
# No test reaches the real model hubs: model downloads are off, except in the processes a test
# points at a stand-in hub on 127.0.0.1 (tests/hubkit.py, hub_env).
os.environ.setdefault("VLCORPUS_OFFLINE", "1")
# One OpenMP thread for torch in every process of the session (builds, workers, scripts):
# pytest-xdist runs 4 workers on 2 cores, and torch's pool of one thread per core spins while
# it waits for a busy core (a featurize stage: 9.1 CPU-s with 2 threads, 4.4 with one).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from pipeline.gc_pause import collector_paused  # noqa: E402  (after the environment above)

# Collection imports every test module and its libraries with the garbage collector paused
# until the tests start (pipeline/gc_pause.py): 13-14 CPU-s a worker process with it running,
# 7.5 paused. Its full passes are spaced out after, as in a build's processes.
_COLLECTING = collector_paused()
_COLLECTING.__enter__()


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    _COLLECTING.__exit__(None, None, None)


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A folder of the test's own in the system's temporary folder, removed after: a TMPDIR for
    the processes a test starts, whose path stays short where ``tmp_path``'s is long (a build's
    fork server listens on a Unix socket in it, and such a path holds at most 107 bytes)."""
    folder = Path(tempfile.mkdtemp(prefix="vlc-test-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def memory_root() -> str:
    """A fresh in-memory corpus root (fsspec ``memory://``)."""
    return f"memory://vlc-{uuid.uuid4().hex}"


def spare_port() -> int:
    """A free port on 127.0.0.1 for a server that must be told its port (a command's --port, a
    URL that has to be the same twice), taken below the kernel's ephemeral range: no bind to
    port 0 and no outgoing connection of a test running beside this one is given it meanwhile.
    Bind port 0 wherever the server allows it; a caller of this retries if the port is taken."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) \
        if Path("/proc/sys/net/ipv4/ip_local_port_range").exists() else 32768
    rng = random.Random()
    while True:
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


# The installed `vlcorpus` script, for the tests that run it as a user types it.
SCRIPT = str(Path(sys.executable).with_name("vlcorpus"))


def vlcorpus(*args: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
             timeout: float = 300, launcher: Sequence[str] = (sys.executable, "-m", "pipeline.cli"),
             ) -> subprocess.CompletedProcess:
    """``vlcorpus ARGS`` in a process of its own, its output captured. ``env``: the whole
    environment (this process's by default). ``launcher``: the command that runs the CLI, by
    default ``python -m pipeline.cli`` (what the script runs); ``(SCRIPT,)``, another venv's
    python, or hubkit.pinned_command's."""
    return subprocess.run([*launcher, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd, env=env)


def stop_group(proc: subprocess.Popen) -> None:
    """Stop ``proc`` and what it started (its session: the server's uvicorn, the worker's flow
    runs). A Prefect worker that was sent SIGTERM waits for its flow runs, a minute at times
    here: not for a test's teardown."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def ended(state) -> bool:
    """Whether the Prefect ``state`` of a live run (a build a test started and did not kill) is its
    end: final, and not the liveness automation's Crashed for silence, which a server too busy to
    take its heartbeats in sets (it was, at the suite's start on a slow 2-core machine); the run
    goes back to Running (flows/revive.py), and its own end replaces that state."""
    from flows.liveness import silenced

    return state is not None and state.is_final() and not silenced(state)


def build_json(config: Path, *args: str, env: Mapping[str, str] | None = None,
               timeout: float = 600) -> tuple[int, dict, str]:
    """``vlcorpus build CONFIG ARGS --json`` as typed (the installed script, in the config's
    folder): its exit status, the summary it printed and its standard error."""
    done = vlcorpus("build", str(config), *args, "--json", cwd=config.parent, timeout=timeout, env=env,
                    launcher=(SCRIPT,))
    assert done.stdout.strip(), done.stderr[-5000:]
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def locked_pins(requirements: str) -> dict[str, str]:
    """Name -> version of each ``name==version ; marker`` line (uv's export, as constraints.txt)
    whose marker holds on this machine, names canonical."""
    from packaging.markers import Marker
    from packaging.utils import canonicalize_name

    pins = {}
    for line in requirements.splitlines():
        requirement, _, marker = line.partition(" ; ")
        if "==" in requirement and not requirement.startswith("#") and (not marker or Marker(marker).evaluate()):
            name, version = requirement.split("==")
            pins[canonicalize_name(name)] = version
    return pins


# Set by `make test`, whose `make system` installed the Debian packages the suite runs.
SYSTEM_INSTALLED = "VLCORPUS_TESTS_SYSTEM_INSTALLED"


def missing_system(why: str) -> NoReturn:
    """A test needs a binary of the Debian packages `make system` installs, and this machine
    lacks it: skipped with ``why`` (which says how to install it) under a plain pytest, a
    failure under `make test`, which installed them (SYSTEM_INSTALLED)."""
    if os.environ.get(SYSTEM_INSTALLED) == "1":
        pytest.fail(f"{why}; make system installs it, yet it is missing", pytrace=False)
    pytest.skip(why)


def require_binaries(*names: str) -> None:
    missing = [n for n in names if shutil.which(n) is None]
    if missing:
        missing_system(f"needs {', '.join(missing)} (apt-get install -y ffmpeg espeak-ng)")


@contextmanager
def moto_s3() -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 for one test (skipped without s3fs or moto); its endpoint.
    moto keeps buckets per process, across servers: name a bucket of the test's own."""
    pytest.importorskip("s3fs")
    moto_server = pytest.importorskip("moto.server")
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        yield "http://{}:{}".format(*server.get_host_and_port())
    finally:
        server.stop()


def tls_env(role: str) -> dict[str, str]:
    """What infra/tls/ROLE.env (`make secrets`) sets for a Dask process of ``role``, its paths
    made absolute (the file gives them from the repository's root)."""
    lines = (ROOT / "infra" / "tls" / f"{role}.env").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))
    return {key: str(ROOT / value) if value.startswith("infra/") else value for key, value in pairs}


def tls_client() -> object:
    """The Security of a Dask client with the certificate of infra/tls/ (`make secrets`)."""
    from distributed.security import Security

    env = tls_env("client")
    return Security(require_encryption=True, **{
        option: env[f"DASK_DISTRIBUTED__COMM__TLS__{name}"] for option, name in
        [("tls_ca_file", "CA_FILE"), ("tls_client_cert", "CLIENT__CERT"), ("tls_client_key", "CLIENT__KEY")]})


@contextmanager
def dask_cluster(tmp_path: Path, workers: list[tuple[str, list[str]]],
                 tls: bool = False) -> Iterator[tuple[str, dict]]:
    """A real Dask cluster on 127.0.0.1 (its HTTP pages too): `dask scheduler` and one `dask
    worker` process group (nanny and worker, 1 thread) per (name, extra args); yields (address,
    {name: Popen}). With ``tls``, TLS only, each process with its role's settings of infra/tls/
    (`make secrets` made them): a client needs ``tls_client()``."""
    dask = str(Path(sys.executable).parent / "dask")
    scheduler_file = tmp_path / "scheduler.json"
    loopback = ["--host", "127.0.0.1", "--no-dashboard", "--dashboard-address", "127.0.0.1:0"]

    def env(role: str) -> dict[str, str]:
        return {**os.environ, **(tls_env(role) if tls else {})}

    procs = [subprocess.Popen([dask, "scheduler", *(["--protocol", "tls"] if tls else []), *loopback,
                               "--port", "0", "--scheduler-file", str(scheduler_file)], env=env("scheduler"))]
    named = {}
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        for name, extra in workers:
            named[name] = subprocess.Popen(
                [dask, "worker", "--scheduler-file", str(scheduler_file), "--name", name,
                 "--nthreads", "1", "--nworkers", "1", *loopback, *extra],
                env=env("worker"), start_new_session=True)
            procs.append(named[name])
        address = json.loads(scheduler_file.read_text())["address"]
        from distributed import Client

        with Client(address, timeout=60, security=tls_client() if tls else None) as client:
            client.wait_for_workers(len(workers), timeout=60)
        yield address, named
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)


@pytest.fixture(scope="session")
def demo_corpus(tmp_path_factory):
    """A demo site of 2 narrated videos (plus the broken and gone pages), discovered and
    downloaded with the real stages (no Prefect), as (corpus root, site dir)."""
    require_binaries("ffmpeg", "ffprobe", "espeak-ng")
    from pipeline.download import stage as download
    from pipeline.config import parse_config
    from pipeline.demo import make_demo_media, serve_demo
    from pipeline.discover import discover
    from pipeline.runner import run_stage
    from pipeline.compose.stages import context
    from pipeline.corpus.storage import Corpus

    base = tmp_path_factory.mktemp("demo")
    site, root = base / "site", base / "corpus"
    make_demo_media(site, n_videos=2, seed=0, quiet=True)
    with serve_demo(site):
        cfg = parse_config({
            "name": "demo-test",
            "sources": [{"type": "list", "path": str(site / "urls.txt")}],
            "download": {"subtitle_langs": ["en", "en-auto"]},
            "execution": {"retry_backoff_s": 0},
        })
        ctx = context(Corpus(str(root)), cfg)
        discover(ctx)
        run_stage(download.STAGE, ctx, batch_size=4)
    return root, site


@pytest.fixture(scope="module")
def builds_fork_server() -> Iterator[None]:
    """One fork server (flows/clusters/fork_server.py) for the builds a test module runs in its process
    (``run_build``): each build nests in it and leaves it running, where each would start one of
    its own, a new interpreter importing the flows (about 2 CPU-s a build). Its workers get the
    build's environment of the moment from their nanny, as ever; what a process reads only when
    it starts (a sitecustomize on PYTHONPATH, as tests/resolverkit.py's) is the module's own,
    which is why it is not the session's."""
    from flows.clusters.fork_server import fork_server

    with fork_server():
        yield


@contextmanager
def own_prefect_server() -> Iterator[object]:
    """A Prefect server of the caller's own (a database of its own, copied from the session's
    migrated empty one), up; stopped once the logs and events queued for it are sent."""
    from flows.services import drain, start_server

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
        server = start_server()
        try:
            yield server
        finally:
            drain()
            server.stop()


@pytest.fixture
def temporary_server():
    """A Prefect server of the test's own (``own_prefect_server``), that the test process, its
    threads and any process it starts share through PREFECT_API_URL, as in production."""
    from flows.services import use_api

    with own_prefect_server() as server, use_api(server.api_url):
        yield server


@pytest.fixture
def prefect_server(temporary_server):
    """The API URL of the test's own Prefect server (``temporary_server``)."""
    return temporary_server.api_url


class Tally:
    """Counters a test module keeps over its tests, printed once at the end of the session as
    ``<name> <counter>: <n>, <counter>: <n>`` (e.g. "bad inputs tried: 40, crashes: 0")."""

    def __init__(self, name: str, counters: tuple[str, ...]) -> None:
        self.name = name
        self.counts = dict.fromkeys(counters, 0)

    def add(self, counter: str, n: int = 1) -> None:
        self.counts[counter] += n

    def line(self) -> str:
        return f"{self.name} " + ", ".join(f"{k}: {v}" for k, v in self.counts.items())


_TALLIES = pytest.StashKey[dict]()


@pytest.fixture(scope="session")
def tally(request):
    """``tally(name, *counters)``: the session's Tally of that name, made on first use."""
    tallies = request.config.stash.setdefault(_TALLIES, {})

    def get(name: str, *counters: str) -> Tally:
        return tallies.setdefault(name, Tally(name, counters))

    return get


def pytest_sessionfinish(session):
    """An xdist worker hands its tallies to the process that prints the summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["vlcorpus_tallies"] = {t.name: t.counts for t in session.config.stash.get(_TALLIES, {}).values()}


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """The tallies of an xdist worker that finished, added to the session's."""
    tallies = node.config.stash.setdefault(_TALLIES, {})
    for name, counts in getattr(node, "workeroutput", {}).get("vlcorpus_tallies", {}).items():
        tally = tallies.setdefault(name, Tally(name, tuple(counts)))
        for counter, n in counts.items():
            tally.add(counter, n)


def pytest_terminal_summary(terminalreporter):
    for tally in terminalreporter.config.stash.get(_TALLIES, {}).values():
        terminalreporter.write_line(tally.line())


def _shares_module_fixture(module: str, _seen: dict[str, bool] = {}) -> bool:  # noqa: B006 - a cache
    """Whether a test module defines a module-scoped fixture (a Prefect stack, a built corpus),
    which its tests share: read from its text, as the process that hands out the tests under
    pytest-xdist collects none."""
    if module not in _seen:
        path = ROOT / module
        text = path.read_text() if path.suffix == ".py" and path.is_file() else ""
        _seen[module] = 'scope="module"' in text or "scope='module'" in text
    return _seen[module]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``, which pyproject's addopts names: every test goes to whichever worker
    is free, except that the tests of a module with a module-scoped fixture go together to one
    worker, which sets the fixture up once, and so do the CHAINED modules; the work is handed
    out in collection order (see ``pytest_collection_modifyitems``). pytest-xdist's own
    loadgroup reads xdist_group marks through ``item._nodeid``, which pytest 9 no longer has:
    its groups never form."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    config.option.loadscopereorder = False
    return ModuleFixtureScheduling(config, log)


# The longest units of work, first (the suite's --durations, 2 cores). Three of them mostly wait
# (on heartbeats, schedules, servers, one command after another) and used half a core each: the
# worker path (a 60 s liveness window, a schedule that fires once a minute), the production
# rehearsal and the getting-started page (the demo and its resume). Started together, they left
# a core idle for minutes. So the last two run one after the other on one worker (CHAINED),
# beside the worker path on another, while the other workers keep the cores busy.
LONGEST_FIRST = ("tests/flows/test_worker.py", "tests/flows/test_rehearsal.py", "tests/docs/test_getting_started.py",
                 "tests/reliability/test_faults.py", "tests/flows/test_download_breaker.py",
                 "tests/flows/test_styles.py", "tests/reliability/test_bad_inputs.py", "tests/flows/test_image.py")
CHAINED = {"tests/flows/test_rehearsal.py": "waits", "tests/docs/test_getting_started.py": "waits"}


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to under pytest-xdist: its module's, when the module
    shares a module fixture or is CHAINED, else its own."""
    module = nodeid.split("::", 1)[0]
    if module in CHAINED:
        return CHAINED[module]
    return module if _shares_module_fixture(module) else nodeid


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """The longest work first, so that under pytest-xdist no worker starts a long test while the
    others run out of work: the modules of LONGEST_FIRST, then the modules whose tests share a
    module fixture (run together) by the number of their slow tests, then each slow test, then
    the rest; each in collection order. The GPU layer is skipped without CUDA."""
    _skip_gpu_tests_without_cuda(items)

    slow: dict[str, int] = {}
    first: dict[str, int] = {}
    for index, item in enumerate(items):
        key = _unit(item.nodeid)
        first.setdefault(key, index)
        slow[key] = slow.get(key, 0) + (item.get_closest_marker("slow") is not None)
    def rank(item: pytest.Item) -> tuple[int, int, int]:
        module = item.nodeid.split("::", 1)[0]
        longest = LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)
        return longest, -slow[_unit(item.nodeid)], first[_unit(item.nodeid)]

    items.sort(key=rank)


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    """The GPU layer (``-m gpu``, make test-gpu) is skipped where torch sees no CUDA device."""
    gpu_tests = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_tests:
        return
    try:
        import torch

        why = None if torch.cuda.is_available() else "no CUDA device (the GPU layer: make test-gpu on a GPU machine)"
    except ImportError:
        why = "no torch"
    if why:
        for item in gpu_tests:
            item.add_marker(pytest.mark.skip(reason=why))
