"""The suite's verdict does not depend on the machine's load or the day.

* No file under ``tests/`` reads a clock (``time.time``, ``time.monotonic``,
  ``time.perf_counter`` and their ``_ns`` forms) or sleeps in real time
  (``time.sleep``, ``asyncio.sleep`` with a delay other than a literal 0),
  outside :data:`REAL_TIME_HELPERS`: durations and rates are benchmark output
  (benchmarks/), waits are on events, latencies are virtual (tests/vtime.py).
* A test that starts processes or sends signals (itself, through a function or
  fixture of its module, or through the Ray and shared-vLLM-run fixtures)
  carries the ``e2e`` marker (registered in pyproject.toml), as do, by hand,
  the tests of real time or of a learning outcome: ``pytest -m e2e`` is the set
  whose verdict could depend on load, the set ``tests/stress.sh --marked``
  repeats under CPU hogs.

Both read the source with :mod:`ast`, so comments and strings never count.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

#: Files allowed a real-time call, each with why.
REAL_TIME_HELPERS = {
    "vtime.py": "advance(): the suite's one sleep with a delay; it refuses a real loop "
                "unless the delay is 0, so under run_virtual the clock jumps at once",
}

_CLOCKS = {"time", "time_ns", "monotonic", "monotonic_ns", "perf_counter", "perf_counter_ns"}


def _is_zero(call: ast.Call) -> bool:
    """The call's delay (first argument or ``delay=``) is a literal 0."""
    args = [*call.args[:1], *(k.value for k in call.keywords if k.arg in ("delay", "secs"))]
    return bool(args) and all(isinstance(a, ast.Constant) and a.value == 0 for a in args)


def real_time_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each clock read and each real sleep in ``source``."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}  # local name -> "time" / "asyncio"
    names: dict[str, str] = {}  # local name -> "time.monotonic", "asyncio.sleep", ...
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in ("time", "asyncio"):
                    modules[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in ("time", "asyncio"):
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def qualified(expr: ast.expr) -> str | None:
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            module = modules.get(expr.value.id)
            return f"{module}.{expr.attr}" if module else None
        if isinstance(expr, ast.Name):
            return names.get(expr.id)
        return None

    sleeps = {"time.sleep", "asyncio.sleep"}
    found: list[tuple[int, str]] = []
    zero_sleeps = {id(node.func) for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and qualified(node.func) in sleeps
                   and _is_zero(node)}
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Attribute, ast.Name)) or id(node) in zero_sleeps:
            continue
        name = qualified(node)
        if name in sleeps or (name and name.startswith("time.")
                              and name.split(".", 1)[1] in _CLOCKS):
            found.append((node.lineno, name))
    return sorted(set(found))


def _sources() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(TESTS)))
def test_no_clock_reads_or_real_sleeps(path: Path) -> None:
    name = str(path.relative_to(TESTS))
    uses = real_time_uses(path.read_text())
    if name in REAL_TIME_HELPERS:
        assert uses, f"tests/{name} no longer uses real time: take it off REAL_TIME_HELPERS"
        return
    assert not uses, (
        f"tests/{name} reads the clock or sleeps in real time: "
        + ", ".join(f"line {line}: {what}" for line, what in uses)
        + ". Wait on an event (or use tests/vtime.py); durations belong in benchmarks/.")


def test_the_checker_finds_clock_reads_and_sleeps_but_not_words() -> None:
    source = '''
import asyncio, time
import time as clock
from time import perf_counter as pc
from asyncio import sleep

async def f(loop, delay):
    """time.time() and asyncio.sleep(1) in a docstring do not count."""
    # nor time.monotonic() in a comment
    started = time.monotonic()
    pc()
    clock.time_ns()
    await asyncio.sleep(delay)
    await sleep(0.5)
    time.sleep(1)
    timer = time.perf_counter
    await asyncio.sleep(0)
    await sleep(0.0)
    loop.time()
    return "time.sleep(3)"
'''
    assert real_time_uses(source) == [
        (10, "time.monotonic"), (11, "time.perf_counter"), (12, "time.time_ns"),
        (13, "asyncio.sleep"), (14, "asyncio.sleep"), (15, "time.sleep"),
        (16, "time.perf_counter")]


#: What starts a process or sends a signal when a test reaches it: a module,
#: an attribute of one, a helper module of the suite, a fixture of a conftest.
_PROCESS_MODULES = ("subprocess", "multiprocessing", "tests.e2e.vllm_runs")
_PROCESS_CALLS = {("os", "kill"), ("os", "killpg"), ("signal", "raise_signal"),
                  ("signal", "pthread_kill")}
_PROCESS_FIXTURES = {"ray_local", "vllm_runs"}


def _marks(nodes: list[ast.expr]) -> set[str]:
    """Names of the ``pytest.mark.X`` (called or not) among ``nodes``."""
    out = set()
    for node in nodes:
        for sub in ast.walk(node):
            if (isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Attribute)
                    and sub.value.attr == "mark"):
                out.add(sub.attr)
    return out


def _starts_processes(node: ast.AST, bound: set[str]) -> bool:
    """``node`` imports a process module, or names one (``bound``: the local
    names the module bound to them), or calls ``os.kill`` and the like."""
    return any(_is_process_use(sub, bound) for sub in ast.walk(node))


def _is_process_use(node: ast.AST, bound: set[str]) -> bool:
    if isinstance(node, ast.Import):
        return any(a.name.startswith(_PROCESS_MODULES) for a in node.names)
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").startswith(_PROCESS_MODULES)
    if isinstance(node, ast.Name):
        return node.id in bound
    return (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and (node.value.id, node.attr) in _PROCESS_CALLS)


def _reaches(node: ast.AST, names: set[str]) -> bool:
    """``node`` names one of ``names`` (a fixture among its arguments included)."""
    args = node.args.args if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) else []
    return _starts_processes(node, names) or any(a.arg in names for a in args)


def unmarked_process_tests(source: str) -> list[str]:
    """The tests of ``source`` without an ``e2e`` mark that start processes or send
    signals: themselves, through a function or fixture of their module, or
    through a fixture of :data:`_PROCESS_FIXTURES`."""
    tree = ast.parse(source)
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names
                      if a.name.startswith(_PROCESS_MODULES)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                _PROCESS_MODULES):
            bound |= {a.asname or a.name for a in node.names}
    defs = {node.name: node for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    # Module functions that start processes, to a fixed point over the calls between them.
    starting = {name for name, node in defs.items() if _starts_processes(node, bound)}
    while more := {name for name, node in defs.items()
                   if name not in starting and _reaches(node, starting | _PROCESS_FIXTURES)}:
        starting |= more
    module = _marks([node.value for node in tree.body if isinstance(node, ast.Assign)
                     and any(isinstance(t, ast.Name) and t.id == "pytestmark"
                             for t in node.targets)])
    return [name for name in sorted(starting) if name.startswith(("test", "Test"))
            and "e2e" not in module | _marks(defs[name].decorator_list)]


@pytest.mark.parametrize("path", sorted(TESTS.rglob("test_*.py")),
                         ids=lambda p: str(p.relative_to(TESTS)))
def test_tests_that_start_processes_are_marked(path: Path) -> None:
    unmarked = unmarked_process_tests(path.read_text())
    assert not unmarked, (
        f"tests/{path.relative_to(TESTS)}: {', '.join(unmarked)} start processes or send "
        "signals without the e2e mark: add pytest.mark.e2e (or the module's pytestmark)")


def test_the_marker_check_follows_helpers_and_fixtures() -> None:
    source = """
import subprocess
from tests.e2e.vllm_runs import SharedRuns
import pytest

def helper():
    return subprocess.run(["true"])

@pytest.fixture
def started():
    return helper()

def test_direct(): SharedRuns(None)
def test_via_fixture(started): pass
def test_via_ray(ray_local): pass
def test_kill(pid): os.kill(pid, 9)
def test_plain(): assert "subprocess"

@pytest.mark.e2e
def test_marked(): helper()
"""
    assert unmarked_process_tests(source) == [
        "test_direct", "test_kill", "test_via_fixture", "test_via_ray"]
    marked = "import subprocess\npytestmark = [pytest.mark.e2e, pytest.mark.timeout(9)]\n" \
             "def test_a(): subprocess.run(['true'])\n"
    assert unmarked_process_tests(marked) == []
