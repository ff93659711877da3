"""Python bytecodes per step, by function: where the hot path's Python work goes.

``bench_instructions.py`` says *how much* a step costs (machine instructions,
load-proof); this says *where* its Python part goes, and it needs no valgrind.
Each workload runs twice in this process under a ``sys.settrace`` opcode tracer,
for ``LO`` and for ``HI`` steps; the difference divided by ``HI - LO`` is each
function's count per step with the imports, the set-up and the warm-up taken
out. The counts are exact: the simulator and the controller's fakes are
deterministic, so a count repeats run to run and on any load.

Bytecodes are not instructions: one that calls into C (a frozen dataclass's
``object.__setattr__``, a dict lookup) costs more than a ``LOAD_FAST``. Use it
to find which functions a change made do more (issue 33 found the per-token
record's cost this way), then weigh that with bench_instructions and the timed
benchmarks. Two trees, function by function (each tree's code, this script):

    python benchmarks/bench_bytecodes.py --workloads balanced --save /tmp/head.json
    (cd BASE_TREE && PYTHONPATH=src python HEAD_TREE/benchmarks/bench_bytecodes.py \\
        --workloads balanced --save /tmp/base.json)
    python benchmarks/bench_bytecodes.py --diff /tmp/base.json /tmp/head.json

Workloads: the simulator examples of ``examples/sim/`` (one policy, default
``windowed``) and ``controller``: ``bench_controller_overhead.run`` at capacity
10^2 (its buffer is full within a step; the benchmark holds the per-step cost
at 10^4 to within 1.2x of it). Traced, a step runs ~30x slower: about a minute
per workload. After each: ``RESULT step_bytecodes.sim.<workload> <thousands>``
or ``RESULT step_bytecodes.controller <thousands>`` (lower is better).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_instructions import WORKLOADS, child, per_step

#: The controller's capacity here: small, so the traced runs stay short.
CONTROLLER_CAPACITY = 100
_STDLIB = Path(sysconfig.get_paths()["stdlib"])


def count_bytecodes(fn: Callable[[], Any]) -> dict[str, int]:
    """Run ``fn()``; the bytecodes each function executed meanwhile, by name."""
    counts: collections.Counter[CodeType] = collections.Counter()
    names: dict[CodeType, str] = {}

    def on_opcode(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[frame.f_code] += 1
        return on_opcode

    def on_call(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code not in names:
            names[code] = function_name(frame)
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return on_opcode

    previous = sys.gettrace()  # a coverage tool's or a debugger's: given back after
    sys.settrace(on_call)
    try:
        fn()
    finally:
        sys.settrace(previous)
    out: collections.Counter[str] = collections.Counter()
    for code, n in counts.items():
        out[names.get(code, code.co_qualname)] += n
    return dict(out)


def function_name(frame: FrameType) -> str:
    """``file:qualname``, the file short (from the package or the stdlib);
    a dataclass's generated ``__init__`` is named by its class."""
    code = frame.f_code
    if code.co_filename == "<string>":
        owner = frame.f_locals.get("self")
        return f"<dataclass {type(owner).__name__}>.{code.co_name}"
    return f"{short_path(code.co_filename)}:{code.co_qualname}"


def short_path(filename: str) -> str:
    path = Path(filename)
    parts = path.parts
    if "site-packages" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("site-packages"):])
    if "asyncrl" in parts:
        return "/".join(parts[len(parts) - 1 - parts[::-1].index("asyncrl"):])
    with contextlib.suppress(ValueError):
        return str(path.relative_to(_STDLIB))
    with contextlib.suppress(ValueError):
        return str(path.relative_to(Path.cwd()))
    return filename


def profile(workload: str, policy: str, lo: int, hi: int) -> dict[str, float]:
    """Bytecodes per step by function (those that ran in the HI run's extra steps)."""
    child(workload, policy, 2, CONTROLLER_CAPACITY)  # imports and first-call caches out of both runs
    a = count_bytecodes(lambda: child(workload, policy, lo, CONTROLLER_CAPACITY))
    b = count_bytecodes(lambda: child(workload, policy, hi, CONTROLLER_CAPACITY))
    steps = {k: per_step(lo, hi, a.get(k, 0), b.get(k, 0)) for k in set(a) | set(b)}
    return {k: v for k, v in steps.items() if v}


def top(profile_: dict[str, float], n: int) -> str:
    total = sum(profile_.values())
    rows = sorted(profile_.items(), key=lambda kv: -kv[1])[:n]
    lines = [f"{'per step':>10} {'share':>6}  function"]
    lines += [f"{v:10.0f} {v / total:6.1%}  {k}" for k, v in rows]
    return "\n".join(lines)


def diff(base: dict[str, float], head: dict[str, float], n: int) -> str:
    keys = sorted(set(base) | set(head), key=lambda k: -abs(head.get(k, 0) - base.get(k, 0)))
    tb, th = sum(base.values()), sum(head.values())
    lines = [f"{'base':>10} {'head':>10} {'head-base':>10}  function",
             f"{tb:10.0f} {th:10.0f} {th - tb:+10.0f}  (all, ratio {th / tb:.3f})"]
    lines += [f"{base.get(k, 0):10.0f} {head.get(k, 0):10.0f} "
              f"{head.get(k, 0) - base.get(k, 0):+10.0f}  {k}" for k in keys[:n]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated: {', '.join(WORKLOADS)}, controller")
    parser.add_argument("--policy", default="windowed", help="the simulator's sampler")
    parser.add_argument("--steps", default="20,60", help="LO,HI (default 20,60)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per workload")
    parser.add_argument("--save", type=Path, help="write the profiles as JSON")
    parser.add_argument("--diff", nargs=2, type=Path, metavar=("BASE", "HEAD"),
                        help="compare two --save files function by function (runs nothing)")
    args = parser.parse_args(argv)
    if args.diff:
        base, head = (json.loads(p.read_text()) for p in args.diff)
        for workload in [w for w in head if w in base]:
            print(f"== {workload}: bytecodes per step\n{diff(base[workload], head[workload], args.top)}")
        return 0
    lo, hi = (int(x) for x in args.steps.split(","))
    saved: dict[str, dict[str, float]] = {}
    for workload in args.workloads.split(","):
        found = saved[workload] = profile(workload, args.policy, lo, hi)
        print(f"== {workload}: bytecodes per step ({lo} -> {hi} steps)\n{top(found, args.top)}")
        name = "controller" if workload == "controller" else f"sim.{workload}"
        print(f"RESULT step_bytecodes.{name} {sum(found.values()) / 1e3:.1f}", flush=True)
    if args.save:
        args.save.write_text(json.dumps(saved, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
