"""No test asserts how long something took: on a loaded 2-core machine any bound on elapsed time
fails now and then, and a bound loose enough never to fail tests nothing. Timings belong in
bench/, hangs to pytest-timeout. An assert is what a test's code says: the behaviour the time
stood for (the error row, the call never made, the state reached) is asserted instead.

The check reads every module of tests/ (their syntax, not their running): a comparison (<, <=,
>, >=) in an ``assert``, or in an ``if`` that raises or calls pytest.fail, with a duration on one
side: the difference of a clock's readings (``time.*()``, ``perf_counter()``, ``monotonic()``,
``datetime.now()``, or a value named as a moment: ``*.timestamp``, ``*_at``), directly, through
the variables, subscripts and attributes a module binds to one, through a function of the
module that returns one, or ``.total_seconds()`` of a difference. A clock reading against a
deadline (``time.monotonic() < deadline``) is a hang guard with a message, not a duration, and
passes. What it cannot see: durations that reach a test as
data (a subprocess's JSON, say); those are for review."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
_TIME_CLOCKS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns",
                "process_time", "process_time_ns", "thread_time", "thread_time_ns"}
_BARE_CLOCKS = {"monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}
_DATETIME_CLOCKS = {"now", "utcnow", "today"}
# Functions that keep a duration a duration (round(elapsed), max(a, b), ...).
_KEEPS = {"round", "abs", "float", "int", "max", "min", "sum"}
_ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)
CLOCK, DURATION = "clock", "duration"


class _Kinds:
    """What the names, subscripts and attributes of one module hold (a clock reading or a
    duration), and which of its functions return one; keyed by their source text, module-wide
    (a test module rarely gives one name two meanings)."""

    def __init__(self, tree: ast.Module) -> None:
        self.bound: dict[str, str] = {}
        self.returns: dict[str, str] = {}
        self.time_names = {alias.asname or alias.name for node in ast.walk(tree)
                           if isinstance(node, ast.ImportFrom) and node.module == "time"
                           for alias in node.names if alias.name in _TIME_CLOCKS}
        functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        assignments = [n for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign | ast.NamedExpr)]
        changed = True
        while changed:  # until nothing new is learnt: a binding can use a later one
            before = (dict(self.bound), dict(self.returns))
            for node in assignments:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if node.value is not None:
                    for target in targets:
                        self._bind(target, node.value)
            for function in functions:
                kinds = {self.kind(r.value) for r in ast.walk(function)
                         if isinstance(r, ast.Return) and r.value is not None} - {None}
                if len(kinds) == 1:
                    self.returns[function.name] = kinds.pop()
            changed = before != (self.bound, self.returns)

    def _bind(self, target: ast.expr, value: ast.expr) -> None:
        if isinstance(target, ast.Tuple | ast.List) and isinstance(value, ast.Tuple | ast.List) \
                and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                self._bind(t, v)
        elif isinstance(target, ast.Name | ast.Attribute | ast.Subscript):
            kind = self.kind(value)
            if kind is not None:
                self.bound[ast.unparse(target)] = kind

    def _is_clock_call(self, call: ast.Call) -> bool:
        func = call.func
        if isinstance(func, ast.Name):
            return func.id in _BARE_CLOCKS or func.id in self.time_names
        if isinstance(func, ast.Attribute):
            owner = ast.unparse(func.value)
            if owner == "time":
                return func.attr in _TIME_CLOCKS
            return func.attr in _DATETIME_CLOCKS and owner.split(".")[-1] == "datetime"
        return False

    def kind(self, node: ast.expr) -> str | None:
        """CLOCK, DURATION or None (neither, or not known)."""
        if isinstance(node, ast.Call):
            func = node.func
            if self._is_clock_call(node):
                return CLOCK
            if isinstance(func, ast.Attribute) and func.attr == "total_seconds":
                inner = func.value
                if isinstance(inner, ast.BinOp) and isinstance(inner.op, ast.Sub):
                    return DURATION
                return DURATION if self.kind(inner) == DURATION else None
            if isinstance(func, ast.Attribute) and func.attr == "timestamp":
                return self.kind(func.value)
            if isinstance(func, ast.Name) and func.id in _KEEPS:
                kinds = {self.kind(a) for a in node.args}
                return DURATION if DURATION in kinds else None
            if isinstance(func, ast.Name):
                return self.returns.get(func.id)
            return None
        if isinstance(node, ast.Name | ast.Attribute | ast.Subscript):
            return self.bound.get(ast.unparse(node)) or (CLOCK if _names_a_moment(node) else None)
        if isinstance(node, ast.BinOp):
            left, right = self.kind(node.left), self.kind(node.right)
            if isinstance(node.op, ast.Sub) and CLOCK in (left, right):
                other = node.right if left == CLOCK else node.left
                # A clock reading less a number is a moment; less another moment, a duration.
                if isinstance(other, ast.Constant) and right != CLOCK:
                    return CLOCK
                return DURATION
            if isinstance(node.op, ast.Add) and CLOCK in (left, right):
                return CLOCK
            if DURATION in (left, right) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult | ast.Div):
                return DURATION
        return None


def _names_a_moment(node: ast.Name | ast.Attribute | ast.Subscript) -> bool:
    """A value named as a moment: ``*.timestamp`` (a Prefect state's), ``*_at`` (``first_at``,
    ``row["downloaded_at"]``)."""
    if isinstance(node, ast.Subscript):
        key = node.slice
        name = key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else ""
    else:
        name = node.id if isinstance(node, ast.Name) else node.attr
    return name == "timestamp" or name.endswith("_at")


def _fails(body: list[ast.stmt]) -> bool:
    """Whether an ``if`` body fails the test: a raise, or pytest.fail."""
    for statement in body:
        if isinstance(statement, ast.Raise):
            return True
        for node in ast.walk(statement):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in ("pytest.fail", "fail"):
                return True
    return False


def wall_clock_asserts(source: str, name: str = "<test>") -> list[str]:
    """``name:line: source`` of each comparison of a duration that a test asserts."""
    tree = ast.parse(source)
    kinds = _Kinds(tree)
    checked = [n.test for n in ast.walk(tree) if isinstance(n, ast.Assert)]
    checked += [n.test for n in ast.walk(tree) if isinstance(n, ast.If) and _fails(n.body)]
    found = []
    for test in checked:
        for node in ast.walk(test):
            if isinstance(node, ast.Compare) and any(isinstance(op, _ORDER) for op in node.ops) \
                    and DURATION in {kinds.kind(part) for part in [node.left, *node.comparators]}:
                found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


# The one duration a test may bound, with why: (module, the comparison as the check prints it).
EXEMPT = {
    ("tests/flows/test_cluster_limits.py", "at - first >= (k - 2) / 10 - 0.02"):
        "a rate limiter's pace is its behaviour: each turn no sooner than the rate allows after a "
        "reading taken before the first ask, a lower bound that a loaded machine only widens",
}


def test_no_test_asserts_a_wall_clock_duration():
    found = [hit for path in sorted(TESTS.rglob("*.py"))
             for hit in wall_clock_asserts(path.read_text(), str(path.relative_to(TESTS.parent)))]
    keys = {hit: (hit.split(":", 1)[0], hit.split(": ", 1)[1]) for hit in found}
    bounded = [hit for hit in found if keys[hit] not in EXEMPT]
    assert bounded == [], "assert the behaviour the time stood for, not the time:\n" + "\n".join(bounded)
    assert set(keys.values()) == set(EXEMPT), "an exemption no longer matches its assert"


# Each form the check must catch (the first five as the suite had them), and forms it must not.
CAUGHT = {
    "elapsed through a variable": """
        started = time.monotonic()
        run()
        elapsed = time.monotonic() - started
        assert elapsed < 30, elapsed
        """,
    "difference in the assert": """
        started = time.monotonic()
        run()
        assert time.monotonic() - started < 15
        """,
    "datetimes and total_seconds": """
        killed, killed_at = time.monotonic(), datetime.now(timezone.utc)
        crashed_s = (crashed.state.timestamp - killed_at).total_seconds()
        assert crashed_s < CRASHED_AFTER_S + 30, crashed_s
        """,
    "a difference of two states' times": """
        silent_s = (silent.state.timestamp - went.timestamp).total_seconds()
        assert silent_s < CRASHED_AFTER_S + 30, silent_s
        """,
    "from time import perf_counter, a helper's return": """
        from time import perf_counter as clock

        def timed(fn):
            start = clock()
            fn()
            return clock() - start

        def test_x():
            assert 2 > timed(run)
        """,
    "through a dict and round": """
        took = {}
        t0 = time.perf_counter()
        took["build"] = round(time.perf_counter() - t0, 1)
        assert took["build"] <= 5
        """,
    "an if that fails": """
        start = time.time()
        run()
        if time.time() - start >= 60:
            pytest.fail("too slow")
        """,
    "two moments' timedelta": """
        assert crashed.state.timestamp - row["killed_at"] < timedelta(seconds=90)
        """,
    "a lower bound": """
        start = time.monotonic()
        pace()
        assert time.monotonic() - start >= 0.5
        """,
}
PASSED = {
    "a deadline": """
        deadline = time.monotonic() + 300
        while not done():
            assert time.monotonic() < deadline, log()
            time.sleep(0.5)
        """,
    "a duration printed": """
        started = time.monotonic()
        run()
        print(f"took {time.monotonic() - started:.0f} s")
        """,
    "the order of two moments": """
        lifted = time.time()
        assert stats.first_at >= lifted
        """,
    "a media duration": """
        assert row["duration_s"] < 0.5
        """,
    "a timed loop": """
        start = time.monotonic()
        while time.monotonic() - start < 5:
            poll()
        """,
}


@pytest.mark.parametrize("case", list(CAUGHT))
def test_the_check_catches_a_wall_clock_assert(case):
    assert len(wall_clock_asserts(textwrap.dedent(CAUGHT[case]))) == 1


@pytest.mark.parametrize("case", list(PASSED))
def test_the_check_passes_what_asserts_no_duration(case):
    assert wall_clock_asserts(textwrap.dedent(PASSED[case])) == []
