"""The sharded trainer (FSDP2, gloo, world size 2) against the in-process one.

Real rank processes, shared by the tests of this module: each test first loads
the same state into both trainers (which also checks single -> fsdp loading).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from asyncrl.policy.build import build_policy
from asyncrl.run.options import sharded_options, trainer_options
from asyncrl.tasks import build_task
from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.distributed import DistributedTrainer, build_local_trainer

from .helpers import TINY, config, fixed_rollouts, fsdp, max_abs_diff

# pytest's 300-s timeout: only a hang reaches it, also on a loaded machine.
pytestmark = pytest.mark.e2e

# float32; every loss term on (decoupled correction, KL to a sharded reference,
# entropy bonus), and micro-batches of 4 sequences so that the ranks plan
# different numbers of passes.
CFG = config(loss={"off_policy_correction": "decoupled", "kl_coef": 0.05,
                   "entropy_coef": 0.01})
TASK = build_task(CFG.task)
#: Chunk metrics that must match the in-process trainer's (the rest are the same
#: arithmetic on the same inputs: advantages, counts).
COMPARED = ("loss", "logprob_mismatch", "logprob_mismatch_max", "clip_frac", "is_ess",
            "entropy", "kl", "num_tokens", "completion_tokens_mean", "advantage_mean",
            "step_tokens", "grad_norm", "lr")


@pytest.fixture(scope="module")
def sharded() -> Iterator[DistributedTrainer]:
    trainer = build_local_trainer(sharded_options(fsdp(CFG)), TASK)
    try:
        yield trainer
    finally:
        asyncio.run(trainer.close())


def single() -> GRPOTrainer:
    model, tokenizer = build_policy(CFG.policy, TASK, seed=CFG.seed)
    return GRPOTrainer.from_options(trainer_options(CFG), model=model, tokenizer=tokenizer)


def same_metrics(a: dict[str, float], b: dict[str, float]) -> None:
    for key in COMPARED:
        if key in a or key in b:
            assert math.isclose(a[key], b[key], rel_tol=1e-5, abs_tol=1e-6), (key, a[key], b[key])


async def run_steps(one: GRPOTrainer, two: DistributedTrainer, steps: list[list]) -> None:
    for chunks in steps:
        v = one.version
        for chunk in chunks:
            same_metrics(await one.train_chunk(chunk, step=v), await two.train_chunk(chunk, step=v))
        same_metrics(await one.finish_step(step=v), await two.finish_step(step=v))
        assert two.version == one.version == v + 1


async def test_five_steps_equal_the_single_process_trainer(sharded: DistributedTrainer) -> None:
    one = single()
    sharded.load_state_dict(one.state_dict())
    steps = [[fixed_rollouts(CFG, 3, seed=10 * s), fixed_rollouts(CFG, 2, seed=10 * s + 1)]
             for s in range(5)]
    await run_steps(one, sharded, steps)
    assert max_abs_diff(one.get_weights_sync(), await sharded.get_weights()) <= 1e-5
    assert max_abs_diff(one.state_dict()["model"], sharded.state_dict()["model"]) <= 1e-5
    await one.close()


async def test_fewer_completions_than_ranks(sharded: DistributedTrainer) -> None:
    """One completion, an all-empty chunk, and a step without any token: every
    rank still runs the same passes (no hang), and nothing changes the result."""
    one = single()
    sharded.load_state_dict(one.state_dict())
    lonely = fixed_rollouts(CFG, 1, lengths=[0, 3, 0, 0], seed=1)
    empty = fixed_rollouts(CFG, 2, lengths=[0, 0, 0, 0], seed=2)
    steps = [[lonely], [empty, fixed_rollouts(CFG, 2, seed=3)], [empty], [lonely, lonely]]
    await run_steps(one, sharded, steps)
    assert max_abs_diff(one.get_weights_sync(), await sharded.get_weights()) <= 1e-5
    await one.close()


async def test_checkpoints_move_between_single_and_fsdp(
        sharded: DistributedTrainer, tmp_path: Path) -> None:
    """A stepped single state loads into fsdp, a sharded checkpoint loads into
    single: the next step is the same on both sides (weights and optimizer moved)."""
    one = single()
    await run_steps(one, sharded, [])  # nothing: both hold their own state
    sharded.load_state_dict(one.state_dict())
    await run_steps(one, sharded, [[fixed_rollouts(CFG, 2, seed=4)]])
    # fsdp -> disk (sharded) -> a fresh single trainer
    shards = tmp_path / "shards"
    shards.mkdir()
    state = sharded.sharded_state_dict(shards)
    assert sorted(p.name for p in shards.iterdir()) == [".metadata", "__0_0.distcp",
                                                        "__1_0.distcp"]
    other = single()
    other.load_state_dict(state)
    assert other.version == sharded.version == 1
    batch = [[fixed_rollouts(CFG, 3, seed=5)]]
    await run_steps(other, sharded, batch)
    # single (stepped twice) -> fsdp, and one more step each
    sharded.load_state_dict(other.state_dict())
    await run_steps(other, sharded, [[fixed_rollouts(CFG, 2, seed=6)]])
    assert max_abs_diff(other.get_weights_sync(), await sharded.get_weights()) <= 1e-5
    await one.close()
    await other.close()


async def test_an_untied_output_layer_equals_the_single_process_trainer() -> None:
    """The output layer's weight of its own (not tied to the embedding), in the
    root unit the chunked loss head reads it from; the embedding a unit of its own."""
    cfg = config(loss={"kl_coef": 0.05},
                 policy={"model": {**TINY, "tie_word_embeddings": False},
                         "generation": {"max_new_tokens": 4}, "train_micro_batch_tokens": 48})
    model, tokenizer = build_policy(cfg.policy, TASK, seed=cfg.seed)
    one = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)
    two = build_local_trainer(sharded_options(fsdp(cfg)), TASK)
    try:
        two.load_state_dict(one.state_dict())
        await run_steps(one, two, [[fixed_rollouts(cfg, 3, seed=s)] for s in range(2)])
        assert max_abs_diff(one.get_weights_sync(), await two.get_weights()) <= 1e-5
    finally:
        await two.close()
        await one.close()


async def test_the_recipe_losses_equal_the_single_process_trainer() -> None:
    """Issue 31's loss modes over two ranks: GSPO's per-sequence ratio (a sequence
    never spans ranks), Dr. GRPO's constant normaliser and leave-one-out
    advantages (summed over the ranks' shares), the dual clip and a k2 KL; and a
    learning-rate schedule, loaded mid-warm-up (every rank's rate at the step)."""
    cfg = config(loss={"ratio_level": "sequence", "aggregation": "constant", "scale": "none",
                       "baseline": "leave_one_out", "dual_clip": 3.0, "kl_coef": 0.05,
                       "kl_estimator": "k2", "off_policy_correction": "decoupled"},
                 policy={"scheduler": {"warmup_steps": 2, "decay": "linear",
                                       "decay_steps": 3}})
    model, tokenizer = build_policy(cfg.policy, TASK, seed=cfg.seed)
    one = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer)
    two = build_local_trainer(sharded_options(fsdp(cfg)), TASK)
    try:
        await one.train_chunk(fixed_rollouts(cfg, 3, seed=99), step=0)
        await one.finish_step(step=0)  # one step into the warm-up ...
        two.load_state_dict(one.state_dict())  # ... where the ranks take over
        await run_steps(one, two, [[fixed_rollouts(cfg, 3, seed=s)] for s in range(3)])
        assert max_abs_diff(one.get_weights_sync(), await two.get_weights()) <= 1e-5
    finally:
        await two.close()
        await one.close()
