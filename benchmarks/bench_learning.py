"""Does asynchrony pay on a real run? Sync vs async GRPO on the quickstart task.

Same config, seed and number of steps; three samplers:

* sync:  ``in_order`` lookahead 0 (on-policy GRPO; the reference, in this run)
* async: ``in_order`` lookahead 1 with ``decoupled`` off-policy correction
* async: ``ready_first`` window 2 with ``decoupled`` correction

Targets: async final reward (mean of the last 10 steps) >= 0.95 x sync, and
async wall time <= 0.8 x sync. Last line: ``RESULT async_speedup <sync wall / best async wall>``
(of the first trainer layout).

Beside the measured speedup: the overlap bound from the sync run's own timeline,
``(gen + train) / max(gen, train)`` (busy time of each side, union of its
intervals) - the speedup perfect overlap would give - and the fraction of it
reached. Per trainer layout (``--trainers``): ``single`` (the trainer in the
controller's process) and ``fsdp1`` (``trainer.strategy: fsdp`` at world size 1:
the same trainer in a process of its own).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from _timeline import busy_time  # noqa: E402  (benchmarks/, the script's folder)
from asyncrl.config import load_config  # noqa: E402
from asyncrl.run.train import train  # noqa: E402

LAYOUTS = {"single": ["trainer.strategy=single", "trainer.world_size=1"],
           "fsdp1": ["trainer.strategy=fsdp", "trainer.world_size=1"]}

VARIANTS = {
    "sync in_order s=0": ["async_rl.sampler.name=in_order",
                          "async_rl.sampler.max_lookahead_versions=0",
                          "loss.off_policy_correction=none"],
    "async in_order s=1": ["async_rl.sampler.name=in_order",
                           "async_rl.sampler.max_lookahead_versions=1",
                           "loss.off_policy_correction=decoupled"],
    "async ready_first s=2": ["async_rl.sampler.name=ready_first",
                              "async_rl.sampler.max_staleness_versions=2",
                              "loss.off_policy_correction=decoupled"],
}


def overlap_bound(run_dir: Path) -> float:
    """``(gen + train) / max(gen, train)`` from a run's timeline: the speedup of
    running the two sides fully overlapped instead of one after the other."""
    timeline = json.loads((run_dir / "timeline.json").read_text())
    gen = busy_time([(i["start"], i["end"]) for i in timeline if i["kind"] == "gen"])
    trainer = busy_time([(i["start"], i["end"]) for i in timeline
                         if i["kind"] in ("train", "sync")])
    return (gen + trainer) / max(gen, trainer)


def run_layout(layout: str, args: argparse.Namespace, common: list[str],
               tmp: Path) -> list[tuple]:
    rows = []
    for i, (name, overrides) in enumerate(VARIANTS.items()):
        cfg = load_config(args.config, [*overrides, *common, *LAYOUTS[layout],
                                        "async_rl.max_buffered_rollouts=64"])
        run_dir = tmp / f"{layout}-run{i}"
        t0 = time.perf_counter()
        summary = train(cfg, run_dir)
        wall = time.perf_counter() - t0
        assert summary["ledger"]["balanced"]
        bound = overlap_bound(run_dir) if i == 0 else None
        rows.append((name, summary["reward_last10_mean"], wall, summary["staleness_mean"],
                     summary["steps"], bound))
        print(f"[{layout}] {name:<24} reward(last10) {rows[-1][1]:.3f}  wall {wall:6.1f}s  "
              f"staleness {rows[-1][3]:.2f}  steps {rows[-1][4]}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=None, help="override grpo.max_num_steps")
    parser.add_argument("--trainers", default="single,fsdp1",
                        help=f"trainer layouts to run, comma-separated, of {sorted(LAYOUTS)}")
    args = parser.parse_args()
    common = ["logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
              "checkpoint.every_steps=0"]
    if args.steps:
        common.append(f"grpo.max_num_steps={args.steps}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for layout in args.trainers.split(","):
            results[layout] = run_layout(layout, args, common, Path(tmp))
    speedups = {}
    for layout, rows in results.items():
        sync_reward, sync_wall, bound = rows[0][1], rows[0][2], rows[0][5]
        print()
        print(f"[{layout}] {'variant':<24}{'reward':>8}{'wall s':>9}{'reward/sync':>13}"
              f"{'wall/sync':>11}")
        for name, reward, wall, *_ in rows:
            print(f"[{layout}] {name:<24}{reward:>8.3f}{wall:>9.1f}{reward / sync_reward:>13.3f}"
                  f"{wall / sync_wall:>11.3f}")
        best_async = min(wall for _, _, wall, *_ in rows[1:])
        ok_reward = all(r >= 0.95 * sync_reward for _, r, *_ in rows[1:])
        speedups[layout] = speedup = sync_wall / best_async
        print(f"[{layout}] targets: async reward >= 0.95 x sync: "
              f"{'PASS' if ok_reward else 'FAIL'}; best async wall <= 0.8 x sync: "
              f"{'PASS' if best_async <= 0.8 * sync_wall else 'FAIL'}")
        print(f"[{layout}] speedup {speedup:.2f}x of an overlap bound of {bound:.2f}x (sync "
              f"run's timeline): {speedup / bound:.2f} of the bound, "
              f"{(speedup - 1) / max(bound - 1, 1e-9):.2f} of the possible gain")
    print(f"RESULT async_speedup {speedups[next(iter(results))]:.3f}")


if __name__ == "__main__":
    main()
