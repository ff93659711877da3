"""Several optimizer steps per training step (issue 31): mini-batches and epochs
against proximal log-probs of the step's start weights, so that the ratio, the
clips and decoupled PPO act; aggregation exact under re-chunking; learning-rate
schedules across a resume."""

from __future__ import annotations

import pytest
import torch
from tests.trainers.test_grpo import make_pair, params, policy, rollouts

from asyncrl.config import LossConfig, OptimizerConfig
from asyncrl.config.policy import PolicyConfig
from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.base import TRAIN_S_IN_FINISH
from asyncrl.trainers.minibatch import split
from asyncrl.trainers.packing import flatten

pytest.importorskip("transformers")

FAST = OptimizerConfig(lr=0.05)  # big steps: the policy moves within one training step


@pytest.fixture(scope="module")
def data():
    """Three on-policy groups of four (the engine holds the trainer's start weights)."""
    import asyncio

    async def make():
        engine, _ = make_pair()
        out = await rollouts(engine, n_groups=3)
        await engine.close()
        return out

    return asyncio.run(make())


def step(data, *, loss: LossConfig | None = None, optimizer=FAST, **kw):
    model, tok = policy()
    trainer = GRPOTrainer(model, tok, loss=loss or LossConfig(), optimizer=optimizer,
                          num_threads=1, max_new_tokens=6, **kw)
    if trainer.holds:
        metrics = trainer.train_step_sync(sorted(data, key=lambda r: r.prompt.prompt_id))
    else:
        trainer.train_chunk_sync(data)
        metrics = trainer.finish_step_sync()
    return trainer, metrics


def test_split_cuts_consecutive_runs_of_about_equal_tokens(data):
    flat = flatten(data, loss=LossConfig(), step=0)
    runs = split(flat, 4)
    assert len(runs) == 4
    assert [i for run in runs for i in run] == list(range(len(flat.seqs)))
    assert len(split(flat, 100)) == len(flat.seqs)  # at most one run per completion


def test_one_optimizer_step_sees_ratio_one_and_never_clips(data):
    model, tok = policy()
    trainer = GRPOTrainer(model, tok, loss=LossConfig(clip_eps=0.05), num_threads=1)
    metrics = trainer.train_chunk_sync(data)
    assert metrics["prox_drift"] == 0.0 and metrics["clip_frac"] == 0.0


def test_mini_batches_take_several_steps_and_the_clip_binds(data):
    trainer, metrics = step(data, loss=LossConfig(clip_eps=0.05), mini_batches=4)
    assert metrics["optimizer_steps"] == 4.0
    assert trainer.version == 1  # one training step, whatever the optimizer steps
    # The passes ran inside finish_step: it says how long, for the step's time split.
    assert metrics[TRAIN_S_IN_FINISH] >= 0.0
    # pi_theta moved away from pi_prox from the second mini-batch on ...
    assert metrics["prox_drift"] > 1e-3
    # ... far enough for the PPO clip to bind.
    assert metrics["clip_frac"] > 0


@pytest.mark.parametrize("loss", [LossConfig(), LossConfig(aggregation="sequence_mean")],
                         ids=["token_mean", "sequence_mean"])
def test_step_counts_cover_every_optimizer_step_not_the_last(data, loss):
    """micro_batches and step_tokens describe the training step (docs/training.md):
    the passes of all its optimizer steps, the divisor of all its completions."""
    _, one = step(data, loss=loss, micro_batch_tokens=16)
    _, several = step(data, loss=loss, micro_batch_tokens=16, mini_batches=2, epochs=3)
    assert several["optimizer_steps"] == 6.0
    assert several["step_tokens"] == pytest.approx(one["step_tokens"])
    assert several["optimizer_step_tokens"] == pytest.approx(one["step_tokens"] / 2)
    # Each epoch runs a pass per sequence group, as the single optimizer step did.
    assert several["micro_batches"] >= 3 * one["micro_batches"]
    assert 0 <= several["pad_frac"] < 1


@pytest.mark.parametrize("loss", [
    LossConfig(clip_eps=0.05, clip_eps_high=0.1),  # clip-higher
    LossConfig(off_policy_correction="decoupled", clip_eps=0.05),
    LossConfig(ratio_level="sequence", aggregation="sequence_mean", clip_eps=0.02),  # GSPO
], ids=["clip_higher", "decoupled", "gspo"])
def test_every_clip_binds_with_epochs(data, loss):
    _, metrics = step(data, loss=loss, mini_batches=2, epochs=2)
    assert metrics["optimizer_steps"] == 4.0
    assert metrics["clip_frac"] > 0


def test_dual_clip_binds_on_negative_advantages(data):
    # Behaviour log-probs far below the proximal ones: pi / mu above c for
    # many tokens, some with A < 0.
    stale = [_shifted(r, -3.0) for r in data]
    plain = LossConfig(clip_eps=0.2)
    dual = LossConfig(clip_eps=0.2, dual_clip=3.0)
    _, without = step(stale, loss=plain)
    _, with_dual = step(stale, loss=dual)
    assert with_dual["loss"] < without["loss"]  # capped at c |A|


def test_mismatch_drop_reports_the_tokens_it_rejected(data):
    stale = [_shifted(r, -1.0) for r in data]  # pi_prox / mu = e for every token
    model, tok = policy()
    trainer = GRPOTrainer(model, tok, num_threads=1, loss=LossConfig(
        off_policy_correction="decoupled", mismatch={"level": "token", "upper": 2.0}))
    assert trainer.train_chunk_sync(stale)["mismatch_dropped_frac"] == pytest.approx(1.0)
    assert trainer.train_chunk_sync(data)["mismatch_dropped_frac"] == 0.0


def test_decoupled_differs_from_tis_only_with_mini_batches(data):
    """One optimizer step: pi_prox is the loss's own detached forward, and
    decoupled gives tis's gradient exactly (docs/training.md). Mini-batches
    make them two different algorithms."""
    def weights(correction, mini_batches):
        loss = LossConfig(off_policy_correction=correction, clip_eps=0.05)
        trainer, _ = step(data, loss=loss, mini_batches=mini_batches)
        return params(trainer.model)

    single = weights("tis", 1), weights("decoupled", 1)
    assert all(torch.allclose(single[0][k], single[1][k], atol=1e-7) for k in single[0])
    several = weights("tis", 4), weights("decoupled", 4)
    assert any(not torch.allclose(several[0][k], several[1][k], atol=1e-5) for k in several[0])


def test_mini_batch_steps_are_deterministic(data):
    a, _ = step(data, mini_batches=3, epochs=2)
    b, _ = step(data, mini_batches=3, epochs=2)
    pa, pb = params(a.model), params(b.model)
    assert all(torch.equal(pa[k], pb[k]) for k in pa)


@pytest.mark.parametrize("loss", [
    LossConfig(aggregation="sequence_mean"),
    LossConfig(aggregation="constant", scale="none"),  # Dr. GRPO
    LossConfig(ratio_level="sequence", aggregation="sequence_mean"),  # GSPO
    LossConfig(baseline="leave_one_out", dual_clip=3.0, clip_eps_high=0.28),
], ids=["sequence_mean", "dr_grpo", "gspo", "rloo_dual"])
def test_aggregation_is_exact_under_rechunking(data, loss):
    """1 chunk vs 3 chunks vs micro-batches of one sequence: the same step."""
    results = []
    for chunks, micro in [([data], 8192), ([data[:1], data[1:2], data[2:]], 8192),
                          ([data], 20)]:
        model, tok = policy()
        trainer = GRPOTrainer(model, tok, loss=loss, micro_batch_tokens=micro,
                              num_threads=1, max_new_tokens=6)
        for chunk in chunks:
            trainer.train_chunk_sync(chunk)
        metrics = trainer.finish_step_sync()
        results.append((params(model), metrics["loss"]))
    ref, ref_loss = results[0]
    for p, loss_value in results[1:]:
        assert loss_value == pytest.approx(ref_loss, rel=1e-5, abs=1e-7)
        for k in ref:
            assert torch.allclose(p[k], ref[k], atol=1e-6), k


async def test_batch_scale_holds_the_step_and_streams_like_one_chunk(data):
    """scale: batch needs every reward of the step: chunks are held, and the step
    equals one chunk of all its groups."""
    loss = LossConfig(scale="batch")
    streamed = GRPOTrainer(*policy(), loss=loss, num_threads=1, optimizer=FAST)
    assert streamed.holds
    for part in (data[:1], data[1:]):
        assert await streamed.train_chunk(part, step=0) == {}
    await streamed.finish_step(step=0)
    whole, _ = step(data, loss=loss)
    a, b = params(streamed.model), params(whole.model)
    assert all(torch.equal(a[k], b[k]) for k in a)
    await streamed.close()


def test_constant_normaliser_is_sequences_times_max_new_tokens(data):
    _, tm = step(data, loss=LossConfig(aggregation="token_mean"))
    _, const = step(data, loss=LossConfig(aggregation="constant"))
    flat = flatten(data, loss=LossConfig(), step=0)
    trained = sum(1 for m in flat.loss_mask if sum(m) > 0)
    assert const["step_tokens"] == trained * 6
    assert tm["step_tokens"] == flat.weight
    assert const["loss"] == pytest.approx(tm["loss"] * flat.weight / (trained * 6), rel=1e-5)


# ---------------------------------------------------------------- schedules
WARMUP = PolicyConfig.model_validate(
    {"scheduler": [{"name": "torch.optim.lr_scheduler.LinearLR",
                    "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": 4}},
                   {"name": "torch.optim.lr_scheduler.ConstantLR",
                    "kwargs": {"factor": 1.0, "total_iters": 10_000_000_000}},
                   {"milestones": [4]}]}).scheduler


def test_lr_follows_the_schedule_once_per_training_step(data):
    model, tok = policy()
    trainer = GRPOTrainer(model, tok, optimizer=OptimizerConfig(lr=0.01), num_threads=1,
                          scheduler=WARMUP, mini_batches=2)
    lrs = []
    for v in range(6):
        lrs.append(trainer.train_step_sync(list(data))["lr"])
        assert trainer.version == v + 1
    assert lrs == pytest.approx([0.001, 0.00325, 0.0055, 0.00775, 0.01, 0.01])


def test_a_resumed_schedule_reproduces_the_uninterrupted_run(data):
    def trainer(lr=0.01, seed=0):
        model, tok = policy(seed)
        return GRPOTrainer(model, tok, optimizer=OptimizerConfig(lr=lr), num_threads=1,
                           scheduler=WARMUP)

    def train(tr):
        tr.train_chunk_sync(data)
        return tr.finish_step_sync()

    straight = trainer()
    for _ in range(2):
        train(straight)
    state = straight.state_dict()
    rest = [train(straight)["lr"] for _ in range(3)]

    resumed = trainer(seed=5)
    resumed.load_state_dict(state)
    assert [train(resumed)["lr"] for _ in range(3)] == rest
    p, q = params(straight.model), params(resumed.model)
    assert all(torch.equal(p[k], q[k]) for k in p)

    # A base rate changed on resume: the schedule re-applied from the resumed step.
    changed = trainer(lr=0.02, seed=5)
    changed.load_state_dict(state)
    assert train(changed)["lr"] == pytest.approx(2 * rest[0])


def _shifted(rollout, delta):
    import dataclasses

    comps = [dataclasses.replace(c, logprobs=[x + delta for x in c.logprobs])
             for c in rollout.result.completions]
    result = dataclasses.replace(rollout.result, completions=comps)
    return dataclasses.replace(rollout, result=result)


def test_lora_adapters_train_in_mini_batches(data):
    from asyncrl.config import LoraConfig

    model, tok = policy()
    trainer = GRPOTrainer(model, tok, lora=LoraConfig(r=4, alpha=8.0), num_threads=1,
                          optimizer=OptimizerConfig(lr=0.05), mini_batches=3)
    base = {k: v.clone() for k, v in trainer.model.state_dict().items() if "lora" not in k}
    metrics = trainer.train_step_sync(list(data))
    assert metrics["optimizer_steps"] == 3.0 and metrics["prox_drift"] > 0
    after = trainer.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in base.items())  # only adapters moved


@pytest.mark.e2e
@pytest.mark.parametrize("option", [
    "loss.clip_eps=0.05",
    "loss.clip_eps_high=0.28",
    "loss.dual_clip=1.01",
    "loss.ratio_level=sequence",
], ids=["clip", "clip_higher", "dual_clip", "gspo"])
def test_every_clip_option_binds_in_a_run(tmp_path, option):
    """A real run (the quickstart's task, asynchronous, decoupled) with four
    mini-batches per step: the option's clip binds (train/clip_frac > 0)."""
    import json
    from pathlib import Path

    from asyncrl.config import load_config
    from asyncrl.run.train import train

    root = Path(__file__).resolve().parents[2]
    cfg = load_config(root / "examples" / "ppo_minibatch.yaml", [
        option, "loss.dual_clip=null" if "dual" not in option else "loss.clip_eps=0.2",
        "grpo.max_num_steps=6", "policy.optimizer.lr=1e-2", "policy.scheduler=null",
        "logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
        "checkpoint.every_steps=0"])
    train(cfg, tmp_path / "run")
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert max(r["train/clip_frac"] for r in rows) > 0
    assert all(r["train/optimizer_steps"] == 4 for r in rows)
