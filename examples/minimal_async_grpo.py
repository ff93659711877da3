"""Asynchronous GRPO in one file, from library pieces, on a CPU.

A 2-layer Llama-shaped model with random weights learns single-digit addition
("2+3=" -> "5"). The rollout engine generates the batches for step v+1 while
the trainer trains step v; the staleness sampler decides how far ahead it may
run (here: one version), and each trained group reports how stale it was.

    python examples/minimal_async_grpo.py              # about a minute
    python examples/minimal_async_grpo.py --seconds 5  # a quick look

`asyncrl train --config examples/quickstart.yaml` (or `asyncrl.train(...)`)
runs the same thing with a run directory, checkpoints, plots and a resumable
state around it; `async with asyncrl.build_controller(config)` builds these
pieces from a config and closes them (docs/controller.md).
"""

import argparse
import asyncio
import copy
import time

from asyncrl.buffer import RolloutBuffer
from asyncrl.config import (
    ArithmeticTaskConfig,
    AsyncRLConfig,
    GenerationConfig,
    GRPOConfig,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    PolicyConfig,
)
from asyncrl.controller import Controller
from asyncrl.engines import EngineOptions, build_engine
from asyncrl.policy.build import build_policy
from asyncrl.sampling import create_sampler
from asyncrl.tasks.arithmetic import ArithmeticTask
from asyncrl.trainers import GRPOTrainer, TrainerOptions

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--seconds", type=float, default=60.0, help="training time budget")
parser.add_argument("--steps", type=int, default=10_000, help="at most this many steps")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()

# ---------------------------------------------------------------- 1. the task
# Prompts "a+b=" with a reward of 1 for the right digit (0.5 for a digit).
task = ArithmeticTask(ArithmeticTaskConfig(max_operand=3, operators="+"))

# ------------------------------------------------------- 2. the policy (model)
policy = PolicyConfig(
    model=ModelConfig(hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128),
    generation=GenerationConfig(temperature=1.0, top_p=1.0, max_new_tokens=2),  # digit, EOS
    optimizer=OptimizerConfig(lr=7e-4, grad_clip=1.0),
    num_threads=1,  # one core generates, one trains
)
model, tokenizer = build_policy(policy, task, seed=args.seed)

# ------------------------------------------ 3. the rollout engine and trainer
# The engine samples from its own copy of the model, in a thread of its own;
# the trainer updates the original and hands the engine new weights each step.
engine = build_engine(policy, EngineOptions(seed=args.seed),
                      model=copy.deepcopy(model), tokenizer=tokenizer)
# Tokens sampled with older weights are corrected by importance sampling.
loss = LossConfig(off_policy_correction="decoupled", is_cap=2.0)
trainer = GRPOTrainer.from_options(TrainerOptions.of(policy, loss), model=model,
                                   tokenizer=tokenizer)

# ----------------------------------------- 4. the buffer and staleness sampler
# in_order with a lookahead of 1: batch d is generated for step d, and may start
# once the trainer reached version d - 1. The buffer holds two steps of groups.
grpo = GRPOConfig(num_prompts_per_step=8, num_generations_per_prompt=8, max_num_steps=args.steps)
async_rl = AsyncRLConfig(max_buffered_rollouts=16, min_groups_for_streaming_train=8,
                         max_inflight_prompts=16)
buffer = RolloutBuffer(async_rl.max_buffered_rollouts)
sampler = create_sampler(buffer, {"name": "in_order", "max_lookahead_versions": 1})


# ------------------------------------------------------- 5. what we look at
class PrintEveryStep:
    """A metrics sink: called by the train pump once per step."""

    def write(self, record: dict) -> None:
        print(f"step {record['step']:4d}  reward {record['reward_mean']:.3f}  "
              f"staleness mean {record['staleness_mean']:.2f} max {record['staleness_max']}  "
              f"trainer idle {record['trainer_idle_s']:.2f}s", flush=True)

    def close(self, summary: dict | None = None) -> None:
        pass


deadline = time.monotonic() + args.seconds


async def stop_when_time_is_up(controller: Controller, version: int) -> None:
    """Called after every step: a graceful stop once the budget is spent."""
    if time.monotonic() >= deadline:
        controller.request_stop("time budget", f"{args.seconds:g} s of training")


# ---------------------------------------------------------- 6. train, async
async def main() -> dict:
    controller = Controller(
        task=task, engines=[engine], trainer=trainer, grpo=grpo, async_rl=async_rl,
        seed=args.seed, buffer=buffer, sampler=sampler, sinks=[PrintEveryStep()],
        on_step_end=stop_when_time_is_up,
    )
    try:
        result = await controller.run()  # the rollout and train pumps, concurrently
    finally:
        await engine.close()
        await trainer.close()
    return result.summary


summary = asyncio.run(main())
ledger = summary["ledger"]
print(f"trained {summary['steps']} steps: last-10 reward {summary['reward_last10_mean']:.3f}, "
      f"staleness mean {summary['staleness_mean']:.2f}; groups dispatched "
      f"{ledger['dispatched']}, trained {ledger['trained']}, pending {ledger['pending']}, "
      f"balanced {ledger['balanced']}")
