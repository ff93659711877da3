"""What the staleness contract buys each recipe: asynchronous vs synchronous
training of plain GRPO, PPO mini-batches, GSPO and Dr. GRPO on the long-tail
built-in task (examples/long_tail.yaml: string reversal whose answer lengths
have a heavy tail, so a few groups generate many times longer than the rest).

Per recipe and seed, two runs of the same config and seed:

* async: the example's sampler (windowed by end_weight, 4 versions) with
  decoupled PPO and loss.max_token_staleness 2;
* sync: in_order with no lookahead (on-policy GRPO).

Per run: wall time until the mean reward of the last 10 steps first reaches
``--target`` (inf when it never does) and that mean at the last step. Medians
over ``--seeds``; the speedup of a recipe is sync time to target over async
time to target.

    python benchmarks/bench_recipes.py --seeds 3 --steps 300 --target 0.5

Last line: ``RESULT recipes_median_async_speedup <median over the recipes>``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from asyncrl.config import load_config  # noqa: E402
from asyncrl.run.train import train  # noqa: E402

CONFIG = ROOT / "examples" / "long_tail.yaml"

RECIPES = {
    "grpo": [],
    "ppo_minibatch": ["policy.train_mini_batches=4", "policy.optimizer.lr=5e-4",
                      "loss.clip_eps_high=0.28", "loss.dual_clip=3.0"],
    "gspo": ["policy.train_mini_batches=2", "loss.ratio_level=sequence",
             "loss.aggregation=sequence_mean"],
    "dr_grpo": ["loss.scale=none", "loss.aggregation=constant"],
}
MODES = {
    "async": [],
    "sync": ["async_rl.sampler={name: in_order, max_lookahead_versions: 0}",
             "async_rl.max_buffered_rollouts=8"],
}
QUIET = ["logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
         "checkpoint.every_steps=100000"]


def time_to_target(run_dir: Path, target: float) -> tuple[float, float]:
    """(wall seconds until the last-10 mean reward first reaches ``target``,
    the last-10 mean at the end)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows]
    reached = math.inf
    for i, row in enumerate(rows):
        window = rewards[max(0, i - 9): i + 1]
        if len(window) == 10 and sum(window) / 10 >= target:
            reached = row["wall_time_s"]
            break
    return reached, sum(rewards[-10:]) / len(rewards[-10:])


def run(recipe: str, mode: str, seed: int, args: argparse.Namespace, tmp: Path) -> tuple:
    overrides = [*RECIPES[recipe], *MODES[mode], *QUIET, f"seed={seed}",
                 f"grpo.max_num_steps={args.steps}"]
    run_dir = tmp / f"{recipe}-{mode}-{seed}"
    t0 = time.perf_counter()
    summary = train(load_config(CONFIG, overrides), run_dir)
    assert summary["ledger"]["balanced"]
    reached, final = time_to_target(run_dir, args.target)
    print(f"{recipe:<14} {mode:<5} seed {seed}: to {args.target} in {reached:7.1f} s, "
          f"final {final:.3f}, wall {time.perf_counter() - t0:6.1f} s", flush=True)
    return reached, final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=0.5)
    parser.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    args = parser.parse_args()
    logging.getLogger("asyncrl").setLevel(logging.ERROR)
    speedups = []
    with tempfile.TemporaryDirectory() as tmp:
        for recipe in args.recipes:
            # async and sync alternate seed by seed, so that a change of the
            # machine's load during the measurement falls on both alike
            rows: dict[str, list[tuple]] = {mode: [] for mode in MODES}
            for seed in range(args.seeds):
                for mode in MODES:
                    rows[mode].append(run(recipe, mode, seed, args, Path(tmp)))
            medians = {mode: (statistics.median(r[0] for r in got),
                              statistics.median(r[1] for r in got))
                       for mode, got in rows.items()}
            (a_time, a_final), (s_time, s_final) = medians["async"], medians["sync"]
            speedup = s_time / a_time if math.isfinite(a_time) else 0.0
            speedups.append(speedup)
            print(f"== {recipe}: median time to {args.target}: async {a_time:.1f} s, sync "
                  f"{s_time:.1f} s (speedup {speedup:.2f}); median final reward: async "
                  f"{a_final:.3f}, sync {s_final:.3f}", flush=True)
    print(f"RESULT recipes_median_async_speedup {statistics.median(speedups):.3f}")


if __name__ == "__main__":
    main()
