"""What DAPO's dynamic sampling buys: wall time and generated tokens to a target
reward, with and without the filter (issue 32).

examples/dapo.yaml (addition, where many groups come back all wrong early and
all right late) run twice per seed, alternately, on the same seed:

* ``filter``: as written, ``grpo.dynamic_sampling: {filter: zero_variance,
  batch_multiplier: 1.5, max_gen_batches: 20}``;
* ``none``: the same with ``filter: none`` and ``batch_multiplier: 1``: every
  group is trained, those without signal included.

Not steps: filtering also shrinks each step's token count (only groups with
signal), which changes the effective step size, so steps to target would favour
the filter by construction. And not the training reward: the filter trains only
groups with signal, whose mean reward is biased (an all-right group is never
trained). The target is on a held-out evaluation instead, the same in both:
every ``--eval-every`` steps, 16 prompts x 4 completions sampled at the
training temperature; a run reaches the target when the mean of its last three
evaluations first reaches ``--target``. At that step: the run's wall time and
its generated tokens (``rollout/generated_tokens`` summed: every group
generated, filtered or not). A run that never reaches it counts as infinite; a
filtered run that stops on its budget (most groups all right: the task is
learned) counts up to where it stopped, and says so.

    python benchmarks/bench_dynamic_sampling.py --seeds 5

Medians over ``--seeds``; last line ``RESULT
dynamic_sampling_time_to_target_ratio <median filter time / median none
time>`` (below 1: the filter gets there sooner), after the same for tokens.
``--smoke`` runs 2 seeds of a few steps with a target of 0 (every run reaches
it): it checks the script and measures nothing.

Measured with ``--seeds 3`` (target 0.7, 1,000 steps) on the shared 2-core
development machine, with issue 32's runtime: the filter reached 0.7 in 15.1,
15.5 and 16.2 s (36,641 median generated tokens) and stopped on its budget
between steps 263 and 361 (the task learned); without it in 37.8 and 35.8 s
(65,419 median tokens), one seed not in 1,000 steps (final 0.688): ratios
0.411 (time) and 0.560 (tokens). At a target of 0.8 two of three seeds without
the filter did not get there in 1,000 steps (the ratio is then nan). Three
seeds on a loaded machine: read the ratio as "well below 1", not to the digit.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from asyncrl.config import load_config  # noqa: E402
from asyncrl.errors import AsyncRLError  # noqa: E402
from asyncrl.run.train import train  # noqa: E402

CONFIG = ROOT / "examples" / "dapo.yaml"
VARIANTS = {
    "filter": [],
    "none": ["grpo.dynamic_sampling.filter=none", "grpo.dynamic_sampling.batch_multiplier=1.0"],
}
QUIET = ["logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
         "checkpoint.every_steps=0"]
#: Evaluations a run's target is judged on (their mean).
WINDOW = 3


def evaluation(every: int) -> list[str]:
    return [f"eval.every_steps={every}", "eval.num_prompts=16", "eval.num_generations=4",
            "eval.temperature=1.0"]


def to_target(rows: list[dict[str, Any]], target: float) -> tuple[float, float, float]:
    """(wall seconds, generated tokens) when the mean of the last :data:`WINDOW`
    evaluations first reaches ``target`` (inf, inf when it never does), and the
    last such mean."""
    tokens = 0.0
    evals: list[float] = []
    for row in rows:
        tokens += float(row.get("rollout/generated_tokens", 0))
        if "eval/reward_mean" not in row:
            continue
        evals.append(float(row["eval/reward_mean"]))
        if len(evals) >= WINDOW and statistics.fmean(evals[-WINDOW:]) >= target:
            return float(row["wall_time_s"]), tokens, statistics.fmean(evals[-WINDOW:])
    last = statistics.fmean(evals[-WINDOW:]) if evals else math.nan
    return math.inf, math.inf, last


def run(variant: str, seed: int, args: argparse.Namespace, tmp: Path) -> tuple[float, float]:
    overrides = [*VARIANTS[variant], *QUIET, *evaluation(args.eval_every), f"seed={seed}",
                 f"grpo.max_num_steps={args.steps}"]
    run_dir = tmp / f"{variant}-{seed}"
    try:
        summary = train(load_config(CONFIG, overrides), run_dir)
        assert summary["ledger"]["balanced"], summary["ledger"]
        how = f"ledger {summary['ledger']}"
    except AsyncRLError as exc:  # the filter's budget: measured up to the stop
        how = f"STOPPED: {str(exc).splitlines()[0][:160]}"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    wall, tokens, last = to_target(rows, args.target)
    print(f"{variant:<6} seed {seed}: to {args.target} in {wall:7.1f} s, {tokens:9.0f} "
          f"generated tokens; eval {last:.3f} (last {WINDOW}), {len(rows)} steps in "
          f"{rows[-1]['wall_time_s']:.1f} s; {how}", flush=True)
    return wall, tokens


def ratio(a: float, b: float) -> float:
    """a / b; nan when ``b`` is infinite (the baseline never reached the target,
    so the ratio is not measured: raise --steps), inf when only ``a`` is."""
    if math.isinf(b):
        return math.nan
    return a / b if b > 0 else math.inf


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--target", type=float, default=0.7)
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--smoke", action="store_true",
                        help="2 seeds of 6 steps, target 0: checks the script, measures nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seeds, args.steps, args.target, args.eval_every = 2, 6, 0.0, 2
    logging.getLogger("asyncrl").setLevel(logging.ERROR)
    got: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            # the variants alternate seed by seed, so that a change of the
            # machine's load during the measurement falls on both alike
            for variant in VARIANTS:
                got[variant].append(run(variant, seed, args, Path(tmp)))
    medians = {v: (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
               for v, rows in got.items()}
    (f_time, f_tokens), (n_time, n_tokens) = medians["filter"], medians["none"]
    print(f"median to {args.target}: filter {f_time:.1f} s, {f_tokens:.0f} tokens; none "
          f"{n_time:.1f} s, {n_tokens:.0f} tokens")
    if math.isinf(n_time):
        print(f"none's median run did not reach {args.target} in {args.steps} steps: the "
              "ratios are not measured (nan); raise --steps")
    print(f"RESULT dynamic_sampling_tokens_to_target_ratio {ratio(f_tokens, n_tokens):.3f}")
    time_ratio = ratio(f_time, n_time)
    print(f"RESULT dynamic_sampling_time_to_target_ratio {time_ratio:.3f}")
    return time_ratio


if __name__ == "__main__":
    main()
