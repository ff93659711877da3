"""Benchmark of ``asyncrl simulate``: speed of the simulator, and a zero-overhead check.

For every example workload in examples/sim/ (num_prompts_per_step = 64) it runs
1,000 steps of each built-in policy (the comparison ``asyncrl simulate
--compare`` makes) plus synchronous GRPO (in_order, lookahead 0), and checks:

* speed: every (workload, policy) run takes <= 10 s of wall time;
* zero controller overhead: the synchronous run's virtual time equals, to 1%,
  the serial reference built from the very latencies the simulated engine drew.
  A synchronous step is "dispatch the step's 64 groups, wait for the last one,
  train, sync"; with ``c = min(rollout_slots, max_inflight_prompts)`` groups at
  a time the generation phase is the makespan of a FIFO queue with ``c``
  servers (just the largest latency when c >= 64). Summed over the steps this
  is the best any controller can do for that policy and those latencies, so
  efficiency against it below 1 would be idle time the controller added.

Prints the efficiency / staleness / waste table per workload, then the checks,
then ``RESULT sim_steps_per_wall_s.<workload> <its runs' steps per wall second>``,
the same per CPU second of this process (``sim_steps_per_cpu_s.<workload>``,
steadier on a shared machine) and last the line
``RESULT sim_steps_per_wall_s <slowest run's steps per wall second>``.
Run: ``python benchmarks/bench_simulate.py [--steps N]``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.sim.reference import serial_reference_s
from asyncrl.sim.report import fmt_duration, plain_table
from asyncrl.sim.runner import BUILTIN_POLICIES, compare, simulate

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = ("balanced", "generation_bound", "training_bound", "long_tail")
WALL_TARGET_S = 10.0
SYNC_EFFICIENCY_TARGET = 0.99


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    args = parser.parse_args(argv)

    runs: list[tuple[str, str, float, float, int]] = []  # workload, policy, wall, cpu, steps
    sync_checks: list[tuple[str, float, float, float]] = []  # workload, achieved, reference, eff
    for workload in args.workloads.split(","):
        path = ROOT / "examples" / "sim" / f"{workload}.yaml"
        cfg = load_config(path)
        assert cfg.simulate is not None
        n = cfg.grpo.num_prompts_per_step

        cpu_marks: list[float] = []
        results = compare(cfg, BUILTIN_POLICIES, steps=args.steps, base_dir=path.parent,
                          record_intervals=False,
                          on_start=lambda _name, marks=cpu_marks: marks.append(time.process_time()))
        cpu_marks.append(time.process_time())
        cpu = [b - a for a, b in itertools.pairwise(cpu_marks)]

        c0 = time.process_time()
        sync = simulate(cfg, sampler_override={"name": "in_order", "max_lookahead_versions": 0},
                        steps=args.steps, base_dir=path.parent, record_intervals=False,
                        note="synchronous GRPO")
        sync_cpu = time.process_time() - c0

        print(f"\n== {workload} ({path.relative_to(ROOT)}): {args.steps} steps x {n} groups, "
              f"{cfg.simulate.rollout_slots} slots, {sync.engine.latency.describe()}")
        print(plain_table([*results, sync]))
        print(results[0].bound.describe())
        for result, cpu_s in zip([*results, sync], [*cpu, sync_cpu]):
            runs.append((workload, result.sampler + ("(s=0)" if result is sync else ""),
                         result.wall_s, cpu_s, result.steps))
            print(f"  {result.sampler:<12} s={result.window}: wall {result.wall_s:5.2f}s "
                  f"(cpu {cpu_s:5.2f}s), {result.steps / result.wall_s:6.1f} steps/wall-s, "
                  f"{result.ledger['dispatched']} groups dispatched, ledger balanced="
                  f"{result.ledger['balanced']}")
        if cfg.simulate.failure_rate == 0:
            reference = serial_reference_s(sync, cfg)
            eff = reference / sync.virtual_time_s
            sync_checks.append((workload, sync.virtual_time_s, reference, eff))
            print(f"  sync vs serial reference: achieved {fmt_duration(sync.virtual_time_s)} "
                  f"({sync.virtual_time_s:.3f}s), reference {reference:.3f}s, efficiency {eff:.6f}")

    print("\n== checks")
    ok = True
    slowest = min(runs, key=lambda r: r[4] / r[2])
    over = [r for r in runs if r[2] > WALL_TARGET_S]
    busiest = max(runs, key=lambda r: r[3])
    print(f"wall per (workload, policy) <= {WALL_TARGET_S:.0f}s: "
          f"{'PASS' if not over else 'FAIL'} (slowest {slowest[0]}/{slowest[1]}: "
          f"{slowest[2]:.2f}s wall, {slowest[3]:.2f}s cpu, {slowest[4]} steps; most cpu "
          f"{busiest[0]}/{busiest[1]}: {busiest[3]:.2f}s; wall above cpu means other "
          "processes shared the cores)")
    ok &= not over
    for workload, achieved, reference, eff in sync_checks:
        good = eff >= SYNC_EFFICIENCY_TARGET
        ok &= good
        print(f"sync efficiency vs serial reference on {workload} >= {SYNC_EFFICIENCY_TARGET}: "
              f"{'PASS' if good else 'FAIL'} ({eff:.6f}; achieved - reference = "
              f"{achieved - reference:+.2e}s)")
    # Per workload: all its runs' steps over all their wall time (what
    # benchmarks/compare.py sets side by side with a base commit's).
    for workload in dict.fromkeys(r[0] for r in runs):
        mine = [r for r in runs if r[0] == workload]
        print(f"RESULT sim_steps_per_wall_s.{workload} "
              f"{sum(r[4] for r in mine) / sum(r[2] for r in mine):.1f}")
        # CPU time of this process: what the other jobs of a shared machine
        # take from the wall time does not count (cache contention still does).
        print(f"RESULT sim_steps_per_cpu_s.{workload} "
              f"{sum(r[4] for r in mine) / sum(r[3] for r in mine):.1f}")
    print(f"RESULT sim_steps_per_wall_s {slowest[4] / slowest[2]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
