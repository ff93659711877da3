"""Does asynchrony pay on a real run? Sync vs async GRPO on the quickstart task.

Same config, seed and number of steps; three samplers:

* sync:  ``in_order`` lookahead 0 (on-policy GRPO; the reference, in this run)
* async: ``in_order`` lookahead 1 with ``decoupled`` off-policy correction
* async: ``ready_first`` window 2 with ``decoupled`` correction

Targets: async final reward (mean of the last 10 steps) >= 0.95 x sync, and
async wall time <= 0.8 x sync. Last line: ``RESULT async_speedup <sync wall / best async wall>``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from asyncrl.config import load_config  # noqa: E402
from asyncrl.runner import train  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(ROOT / "examples" / "quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=None, help="override grpo.max_num_steps")
    args = parser.parse_args()
    common = ["logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
              "checkpoint.every_steps=0"]
    if args.steps:
        common.append(f"grpo.max_num_steps={args.steps}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, overrides) in enumerate(VARIANTS.items()):
            cfg = load_config(args.config, [*overrides, *common,
                                            "async_rl.max_buffered_rollouts=64"])
            t0 = time.perf_counter()
            summary = train(cfg, Path(tmp) / f"run{i}")
            wall = time.perf_counter() - t0
            assert summary["ledger"]["balanced"]
            rows.append((name, summary["reward_last10_mean"], wall, summary["staleness_mean"],
                         summary["steps"]))
            print(f"{name:<24} reward(last10) {rows[-1][1]:.3f}  wall {wall:6.1f}s  "
                  f"staleness {rows[-1][3]:.2f}  steps {rows[-1][4]}", flush=True)
    sync_reward, sync_wall = rows[0][1], rows[0][2]
    print()
    print(f"{'variant':<24}{'reward':>8}{'wall s':>9}{'reward/sync':>13}{'wall/sync':>11}")
    for name, reward, wall, _, _ in rows:
        print(f"{name:<24}{reward:>8.3f}{wall:>9.1f}{reward / sync_reward:>13.3f}"
              f"{wall / sync_wall:>11.3f}")
    best_async = min(wall for _, _, wall, _, _ in rows[1:])
    ok_reward = all(r >= 0.95 * sync_reward for _, r, _, _, _ in rows[1:])
    print(f"targets: async reward >= 0.95 x sync: {'PASS' if ok_reward else 'FAIL'}; "
          f"best async wall <= 0.8 x sync: {'PASS' if best_async <= 0.8 * sync_wall else 'FAIL'}")
    print(f"RESULT async_speedup {sync_wall / best_async:.3f}")


if __name__ == "__main__":
    main()
