"""Does each way of running learn? Reward rises over several seeds, per variant.

``make test`` asserts learning only where the outcome does not depend on thread
scheduling (deterministic mode, a result of the seed alone) or against a
negative control with a margin measured under load
(tests/e2e/test_workloads.py). The runs whose curves depend on scheduling -
the asynchronous samplers, LoRA, a rollout function, vLLM, a sharded trainer on
Ray - are measured here instead, over ``--seeds`` seeds: per run the mean reward
of the first and of the last ``window`` steps and the rise between them.

Variants (the claims the end-to-end tests made before they moved here):

* ``in_order``, ``weight_fifo``, ``windowed``, ``ready_first``: examples/<name>.yaml,
  120 steps, window 10 (was: rise > 0.05 in tests/e2e/test_train.py)
* ``lora``: the quickstart with ``policy.lora.r=8``, 150 steps, window 20 (rise > 0.015)
* ``tool_use``: examples/tool_use.yaml at lr 2e-3, 40 steps, window 10 (rise > 0.015
  and the end over twice the start)
* ``vllm_sync``: the quickstart on vLLM, synchronous (lookahead 0), 16 groups a step,
  lr 3e-3, 20 steps, window 5 (rise > 0.02)
* ``ray_fsdp``: the quickstart on the sums of 0 and 1, ``trainer.strategy=fsdp`` at
  world size 2 on a local Ray instance, 30 steps, window 10 (rise > 0.1)

    python benchmarks/bench_convergence.py --seeds 5 --variants in_order,lora

Per variant a ``RESULT learning_rise_<variant>_median <median rise>`` line, and
how many seeds cleared the bar the test used to assert. Measured with
``--seeds 3`` on the shared 2-core machine: median (min) rise in_order 0.254
(0.207), weight_fifo 0.274 (0.207), windowed 0.225 (0.223), ready_first 0.245
(0.175), lora 0.038 (0.037), tool_use 0.039 (0.036), vllm_sync 0.077 (0.066),
ray_fsdp 0.262 (0.212): every seed over its old bar.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))  # tool_use:calculator, as its config says

from asyncrl.config import load_config  # noqa: E402
from asyncrl.metrics.report import read_metrics  # noqa: E402
from asyncrl.run.train import train  # noqa: E402

QUIET = ["logging.progress=never", "logging.plots=false", "logging.tensorboard=false",
         "checkpoint.every_steps=0"]
QUICKSTART = "examples/quickstart.yaml"
#: name -> (config, overrides, steps, window, the bar the test asserted on the rise)
VARIANTS: dict[str, tuple[str, list[str], int, int, float]] = {
    **{name: (f"examples/{name}.yaml", [], 120, 10, 0.05)
       for name in ("in_order", "weight_fifo", "windowed", "ready_first")},
    "lora": (QUICKSTART, ["policy.lora.r=8"], 150, 20, 0.015),
    "tool_use": ("examples/tool_use.yaml", ["policy.optimizer.lr=2e-3"], 40, 10, 0.015),
    "vllm_sync": (QUICKSTART, [
        "policy.engine=vllm", "policy.model.num_heads=2", "grpo.num_prompts_per_step=16",
        "async_rl.max_buffered_rollouts=32", "async_rl.max_inflight_prompts=32",
        "async_rl.min_groups_for_streaming_train=16",
        "async_rl.sampler.max_lookahead_versions=0", "policy.optimizer.lr=3e-3"], 20, 5, 0.02),
    "ray_fsdp": (QUICKSTART, [
        "task.max_operand=1", "grpo.num_generations_per_prompt=16", "policy.optimizer.lr=2e-3",
        "trainer.strategy=fsdp", "trainer.world_size=2", "cluster.backend=ray",
        "cluster.num_rollout_workers=1", "cluster.rollout_worker.num_cpus=0.5",
        "cluster.trainer.num_cpus=0.5"], 30, 10, 0.1),
}


def rise(variant: str, seed: int, tmp: Path) -> tuple[float, float]:
    """(first-window mean reward, last-window mean reward) of one run."""
    config, overrides, steps, window, _ = VARIANTS[variant]
    cfg = load_config(ROOT / config, [*overrides, *QUIET, f"seed={seed}",
                                      f"grpo.max_num_steps={steps}"])
    run_dir = tmp / f"{variant}-{seed}"
    summary = train(cfg, run_dir)
    assert summary["ledger"]["balanced"] and summary["steps"] == steps, summary
    rewards = [r["reward_mean"] for r in read_metrics(run_dir)]
    return sum(rewards[:window]) / window, sum(rewards[-window:]) / window


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated, of {list(VARIANTS)}")
    args = parser.parse_args()
    logging.getLogger("asyncrl").setLevel(logging.ERROR)
    os.chdir(ROOT)  # the examples' data paths are relative to the repository root
    # ray_fsdp: a Ray instance of its own (not a cluster an address file names), its
    # workers at this process's priority (at Ray's default nice 15 they starve).
    os.environ.setdefault("RAY_ADDRESS", "local")
    os.environ.setdefault("RAY_worker_niceness", "0")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant in args.variants.split(","):
            bar = VARIANTS[variant][4]
            for seed in range(args.seeds):
                start, end = rise(variant, seed, Path(tmp))
                results.setdefault(variant, []).append(end - start)
                print(f"{variant:<12} seed {seed}: {start:.3f} -> {end:.3f}  rise "
                      f"{end - start:+.3f}", flush=True)
            rises = results[variant]
            print(f"{variant:<12} rise median {statistics.median(rises):+.3f}, min "
                  f"{min(rises):+.3f}; {sum(r > bar for r in rises)}/{len(rises)} seeds over "
                  f"{bar}", flush=True)
    for variant, rises in results.items():
        print(f"RESULT learning_rise_{variant}_median {statistics.median(rises):.3f}")


if __name__ == "__main__":
    main()
