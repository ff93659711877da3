"""Instructions per step of the hot path, counted by valgrind: a load-proof measure.

Wall and CPU time on a shared machine spread by ±15% between runs of one tree,
which hides a 5% change. The number of machine instructions a run executes
does not depend on the load. Each workload runs twice under
``valgrind --tool=callgrind`` (``PYTHONHASHSEED=0``, no ``.pyc`` written, so
both runs import alike in a fresh tree), for ``LO`` and for
``HI`` steps; the difference divided by ``HI - LO`` is the cost of a step with
the imports, the set-up and the warm-up taken out.

Workloads: the simulator examples of ``examples/sim/`` (one policy, default
``windowed``) and ``controller``: ``bench_controller_overhead.run`` at capacity
10^4 (the tree's own script and fakes, from the working directory, so a base
commit runs its own), from step 200 on, where its buffer is full.

Instructions are not time: memory stalls and cache misses are not in them (add
``--cache-sim`` to see the modelled cache misses). Use it beside the timed
benchmarks, through ``benchmarks/compare.py``:

    python benchmarks/compare.py BASE_REF "bench_instructions --workloads balanced" \\
        --scripts head --rounds 1

(one round is enough: the counts repeat to within 0.1%). A run under valgrind
is ~50x slower than a plain one: each workload takes about a minute.

After each workload: ``RESULT step_instructions.sim.<workload> <millions>``
or ``RESULT step_instructions.controller <millions>`` (lower is better).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

WORKLOADS = ("balanced", "generation_bound", "training_bound", "long_tail")
COLLECTED = re.compile(r"Collected\s*:\s*(\d+)")
#: Cache-simulation totals: I1 and D1 misses (reads and writes).
SUMMARY = re.compile(r"^==\d+== (I1  misses|D1  misses):\s*([\d,]+)", re.M)
#: The controller workload: capacity, and the step from which the buffer is full.
CONTROLLER_CAPACITY, CONTROLLER_FULL_BY = 10**4, 200


def per_step(lo: int, hi: int, count_lo: int, count_hi: int) -> float:
    """Instructions per step from a run of ``lo`` and one of ``hi`` steps."""
    if hi <= lo:
        raise ValueError(f"--steps LO,HI: HI ({hi}) must be larger than LO ({lo})")
    return (count_hi - count_lo) / (hi - lo)


def parse_count(stderr: str) -> int:
    """The instruction count callgrind reports at exit."""
    match = COLLECTED.search(stderr)
    if match is None:
        raise RuntimeError("valgrind printed no instruction count; its output ends:\n"
                           + stderr[-2000:])
    return int(match.group(1))


def misses(err_lo: str, err_hi: str) -> list[tuple[str, int, int]]:
    """The I1 and D1 cache misses valgrind's summary gives for both runs."""
    lo, hi = dict(SUMMARY.findall(err_lo)), dict(SUMMARY.findall(err_hi))
    return [(key.split()[0], int(lo[key].replace(",", "")), int(hi[key].replace(",", "")))
            for key in ("I1  misses", "D1  misses") if key in lo and key in hi]


def child(workload: str, policy: str, steps: int, capacity: int = CONTROLLER_CAPACITY) -> None:
    """Run ``steps`` steps of ``workload`` (in the process valgrind watches), from
    the working directory's tree; ``capacity``: the controller workload's buffer."""
    if workload == "controller":
        sys.path.insert(0, str(Path.cwd() / "benchmarks"))
        from bench_controller_overhead import run  # the tree's own script and fakes

        # A script that refuses to time so few steady steps exits after the run.
        with contextlib.suppress(SystemExit):
            run(capacity, steps)
        return
    from asyncrl.config import load_config
    from asyncrl.sim.runner import compare

    path = Path.cwd() / "examples" / "sim" / f"{workload}.yaml"
    cfg = load_config(path)
    compare(cfg, [policy], steps=steps, base_dir=path.parent, record_intervals=False)


def count(workload: str, policy: str, steps: int, cache_sim: bool) -> tuple[int, str]:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
           *(["--cache-sim=yes"] if cache_sim else []),
           sys.executable, __file__, "--child", workload, policy, str(steps)]
    # No .pyc written by either run: in a fresh tree (compare.py's worktree) the
    # LO run would otherwise compile every module and the HI run load them,
    # and the difference would come out short by the compile (~5 M instructions
    # per step of a 100-step difference). Both runs now import alike.
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{workload}, {steps} steps: the run under valgrind failed "
                         f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
    return parse_count(done.stderr), done.stderr


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS),
                        help=f"comma-separated: {', '.join(WORKLOADS)}, controller")
    parser.add_argument("--policy", default="windowed", help="the simulator's sampler")
    parser.add_argument("--steps", default="20,120", help="LO,HI (default 20,120)")
    parser.add_argument("--cache-sim", action="store_true",
                        help="also model the caches (slower) and print their misses per step")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        workload, policy, steps = args.child
        child(workload, policy, int(steps))
        return 0
    if shutil.which("valgrind") is None:
        # Skipped, not failed: `make bench` runs every script, valgrind or not.
        print("bench_instructions: skipped, it needs valgrind on the PATH (Debian/Ubuntu: "
              "apt install valgrind)")
        return 0
    lo, hi = (int(x) for x in args.steps.split(","))
    for workload in args.workloads.split(","):
        a, b = (lo, hi) if workload != "controller" else (CONTROLLER_FULL_BY,
                                                          CONTROLLER_FULL_BY + hi - lo)
        (n_lo, err_lo), (n_hi, err_hi) = (count(workload, args.policy, s, args.cache_sim)
                                          for s in (a, b))
        step = per_step(a, b, n_lo, n_hi)
        line = f"{workload}: {step / 1e6:.3f} M instructions per step ({a} -> {b} steps)"
        if args.cache_sim:
            line += "".join(f", {name} misses {per_step(a, b, lo_n, hi_n) / 1e3:.1f} k"
                            for name, lo_n, hi_n in misses(err_lo, err_hi))
        print(line)
        name = "controller" if workload == "controller" else f"sim.{workload}"
        print(f"RESULT step_instructions.{name} {step / 1e6:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
