"""Where the suite's CPU goes, test by test: ``pytest -p tests.cpu_by_test`` from the
repository's root (``make test PYTEST_ARGS="-p tests.cpu_by_test"``) ends with the test files
and tests that took the most CPU seconds, and their total.

The suite is CPU-bound on 2 cores (4 workers share them), so its time goal is a CPU budget; a
test's wall seconds say more of the load around it than of its own cost. A test's CPU seconds
here are those of the process that ran it, from its setup to the end of its teardown, plus those
of the child processes that ended and were waited for meanwhile (``RUSAGE_CHILDREN``: a build's
command and its server, checks and workers; a process that outlives its test counts where it is
reaped, a module's shared stack in the teardown of its last test). Each worker of pytest-xdist
measures its own tests; the figure travels to the controller in the test's report."""

from __future__ import annotations

import resource
from collections import Counter

import pytest

KEY = "cpu_s"
SHOWN = 15
_started: dict[str, float] = {}
_spent: Counter[str] = Counter()


def _cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children so far."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _started[item.nodeid] = _cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    if call.when == "teardown" and item.nodeid in _started:
        outcome.get_result().user_properties.append((KEY, _cpu_s() - _started.pop(item.nodeid)))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":
        spent = dict(report.user_properties).get(KEY)
        if spent is not None:
            _spent[report.nodeid] += spent


def pytest_terminal_summary(terminalreporter) -> None:
    if not _spent:
        return
    by_file: Counter[str] = Counter()
    for nodeid, spent in _spent.items():
        by_file[nodeid.split("::")[0]] += spent
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds by test")
    write(f"{sum(_spent.values()):.0f} CPU-s in {len(_spent)} tests")
    for title, counts in (("files", by_file), ("tests", _spent)):
        write(f"the {SHOWN} heaviest {title}:")
        for name, spent in counts.most_common(SHOWN):
            write(f"{spent:8.1f}  {name}")
