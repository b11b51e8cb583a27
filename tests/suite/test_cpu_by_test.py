"""tests/cpu_by_test.py: a test's CPU seconds count those of the child processes it waited for,
and reach the summary from the workers of pytest-xdist."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from conftest import ROOT

# A child that spins until it has spent half a CPU-second of its own: a figure no load changes.
SPIN = """
import subprocess, sys

def test_spins_in_a_child():
    subprocess.run([sys.executable, "-c", "import time\\nwhile time.process_time() < 0.5: pass"], check=True)
"""
IDLE = """
def test_does_nothing():
    pass
"""


def _figures(output: str) -> dict[str, float]:
    return {name: float(spent) for spent, name in re.findall(r"^\s+([\d.]+)\s{2}(\S+)$", output, re.M)}


def test_the_summary_counts_each_tests_children_across_xdist_workers(tmp_path):
    (tmp_path / "test_spin.py").write_text(SPIN)
    (tmp_path / "test_idle.py").write_text(IDLE)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.cpu_by_test", "-n", "2",
                           "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path), str(tmp_path)],
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "CPU seconds by test" in done.stdout and " in 2 tests" in done.stdout, done.stdout
    figures = _figures(done.stdout)
    spin, idle = figures["test_spin.py::test_spins_in_a_child"], figures["test_idle.py::test_does_nothing"]
    assert spin >= 0.5 and figures["test_spin.py"] == spin, done.stdout
    assert idle < 0.5 and figures["test_idle.py"] == idle, done.stdout
