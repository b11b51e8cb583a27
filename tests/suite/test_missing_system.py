"""A binary of the Debian packages `make system` installs (ffmpeg, ffprobe, espeak-ng, chromium,
PostgreSQL), missing: a plain pytest skips the tests that need it, with the command that
installs it; `make test` and its Python 3.12 run, which installed them, fail those tests, so that
a green `make test` has run them all."""

from __future__ import annotations

import subprocess

import pytest
from conftest import ROOT, SYSTEM_INSTALLED, require_binaries

NONE_SUCH = "vlcorpus-no-such-binary"


def _outcome(*names: str) -> tuple[type[BaseException], str]:
    """What ``require_binaries(*names)`` ends the test with (a skip, a failure), and its message;
    caught here, so that neither becomes this test's own outcome."""
    with pytest.raises(BaseException) as raised:
        require_binaries(*names)
    return raised.type, str(raised.value)


def test_a_missing_binary_is_a_skip_with_the_install_hint(monkeypatch):
    monkeypatch.delenv(SYSTEM_INSTALLED, raising=False)
    kind, message = _outcome("sh", NONE_SUCH)
    assert kind is pytest.skip.Exception and message.startswith(f"needs {NONE_SUCH} (apt-get install -y")


def test_a_missing_binary_fails_where_make_system_ran(monkeypatch):
    monkeypatch.setenv(SYSTEM_INSTALLED, "1")
    kind, message = _outcome(NONE_SUCH)
    assert kind is pytest.fail.Exception and f"needs {NONE_SUCH}" in message and "make system" in message
    require_binaries("sh")  # present: nothing to say


def _pytest_lines(target: str) -> list[str]:
    """The pytest command lines ``make TARGET`` would run (make -n: nothing runs)."""
    shown = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return [line for line in shown.stdout.splitlines() if " -m pytest " in line]


@pytest.mark.parametrize("target, runs", [("test", 2), ("test-py312", 1)])
def test_make_test_says_the_system_is_installed(target, runs):
    """Its own run and the Python 3.12 one (which `make test` runs first)."""
    lines = _pytest_lines(target)
    assert len(lines) == runs and all(f"{SYSTEM_INSTALLED}=1 " in line for line in lines), lines


def test_make_test_gpu_does_not():
    """A GPU machine gets no `make system` (and may have no ffmpeg): its build test skips."""
    (line,) = _pytest_lines("test-gpu")
    assert SYSTEM_INSTALLED not in line
