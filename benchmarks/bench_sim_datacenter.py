"""Datacenter scale: 1,000 simulated steps of 4,096 groups on 32,768 slots.

``examples/sim/datacenter.yaml`` (lognormal latencies, streamed training,
windowed s = 2 by end weight) in cohort mode (docs/simulate.md, section 6):
~4.3 M groups dispatched. Targets: under 60 s of wall time and under 2 GB of
peak memory (resident set size of this process, which runs nothing else
before).

The reference measured in the same run: the first ``--check-steps`` steps of
the very same workload in the per-group mode (the real controller) must give
exactly the same row (efficiency, staleness, waste, ...), and the ratio of
the two modes' groups per wall second is the cohort speedup.

Prints the check, then ``RESULT sim_datacenter_peak_rss_mb <MB>``,
``RESULT sim_datacenter_cohort_speedup <x>``,
``RESULT sim_datacenter_1k_steps_cpu_s <CPU seconds of the cohort run, per
1,000 steps>`` and last
``RESULT sim_datacenter_1k_steps_s <wall seconds for 1,000 steps>``
(``--steps N`` runs N steps and scales the seconds to 1,000).
Run: ``python benchmarks/bench_sim_datacenter.py [--steps N] [--check-steps N]``.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

from asyncrl.config import load_config
from asyncrl.sim.runner import ROW_KEYS, simulate

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "examples" / "sim" / "datacenter.yaml"
WALL_TARGET_S = 60.0
RSS_TARGET_MB = 2048.0


def peak_rss_mb() -> float:
    # ru_maxrss is in kilobytes on Linux (bytes on macOS).
    scale = 1 / 1024 / 1024 if sys.platform == "darwin" else 1 / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def with_mode(cfg, mode: str):
    return cfg.model_copy(update={"simulate": cfg.simulate.model_copy(update={"mode": mode})})


def same_row(a, b) -> list[str]:
    """The row keys on which two results differ (beyond float rounding)."""
    out = []
    for key in ROW_KEYS:
        x, y = a.row()[key], b.row()[key]
        if isinstance(x, float) and isinstance(y, float):
            if not math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-12):
                out.append(f"{key} {x:.6g} vs {y:.6g}")
        elif x != y:
            out.append(f"{key} {x} vs {y}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--check-steps", type=int, default=5)
    args = parser.parse_args(argv)
    cfg = load_config(CONFIG)
    assert cfg.simulate is not None and cfg.simulate.mode == "cohort"

    t0, cpu0 = time.perf_counter(), time.process_time()
    result = simulate(cfg, steps=args.steps, record_intervals=False)
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    rss = peak_rss_mb()
    groups = result.ledger["dispatched"]
    print(f"cohort mode: {result.steps} steps x {cfg.grpo.num_prompts_per_step} groups on "
          f"{cfg.simulate.rollout_slots} slots, {groups:,} groups dispatched in {wall:.1f}s "
          f"({groups / wall:,.0f} groups/s), peak RSS {rss:.0f} MB")
    print(f"  efficiency {result.efficiency:.4f}, staleness mean {result.staleness_mean:.3f}, "
          f"token staleness p95 {result.token_staleness_p95}, waste {result.waste_frac:.4f}, "
          f"masked {result.masked_token_frac:.4f}, ledger balanced {result.ledger['balanced']}")

    cohort = simulate(cfg, steps=args.check_steps, record_intervals=False)
    per_group = simulate(with_mode(cfg, "per_group"), steps=args.check_steps,
                         record_intervals=False)
    differ = same_row(per_group, cohort)
    speedup = (cohort.ledger["dispatched"] / cohort.wall_s) / (
        per_group.ledger["dispatched"] / per_group.wall_s)
    print(f"  per-group mode (the real controller), first {args.check_steps} steps: "
          f"{per_group.ledger['dispatched'] / per_group.wall_s:,.0f} groups/s; cohort mode "
          f"{speedup:.1f}x as fast; rows {'identical' if not differ else 'DIFFER: '}"
          + "; ".join(differ))

    scaled = wall * 1000 / args.steps
    ok = not differ and scaled < WALL_TARGET_S and rss < RSS_TARGET_MB
    print(f"1,000 steps < {WALL_TARGET_S:.0f}s: {'PASS' if scaled < WALL_TARGET_S else 'FAIL'} "
          f"({scaled:.1f}s{'' if args.steps == 1000 else f', scaled from {args.steps} steps'}); "
          f"peak memory < {RSS_TARGET_MB:.0f} MB: {'PASS' if rss < RSS_TARGET_MB else 'FAIL'}; "
          f"cohort = per-group: {'PASS' if not differ else 'FAIL'}")
    print(f"RESULT sim_datacenter_peak_rss_mb {rss:.0f}")
    print(f"RESULT sim_datacenter_cohort_speedup {speedup:.2f}")
    # CPU seconds too: on a shared machine they move less with the load than wall time.
    print(f"RESULT sim_datacenter_1k_steps_cpu_s {cpu * 1000 / args.steps:.1f}")
    print(f"RESULT sim_datacenter_1k_steps_s {scaled:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
