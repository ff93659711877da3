"""GRPOTrainer: log-prob plumbing with the engine, steps, accumulation, checkpoints."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import math
import threading

import pytest
import torch

from asyncrl.config import (
    ArithmeticTaskConfig,
    GenerationConfig,
    LossConfig,
    ModelConfig,
    OptimizerConfig,
    PolicyConfig,
    RunConfig,
)
from asyncrl.engines import LocalEngine
from asyncrl.policy.build import build_policy
from asyncrl.run.backends import build_local_backends
from asyncrl.run.options import engine_options, trainer_options
from asyncrl.tasks import ArithmeticTask
from asyncrl.trainers import GRPOTrainer, Trainer
from asyncrl.types import GenerationRequest, Rollout

pytest.importorskip("transformers")

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
TASK = ArithmeticTask(ArithmeticTaskConfig(max_operand=99, operators="+-"))


def policy(seed: int = 0):
    return build_policy(PolicyConfig(model=TINY), TASK, seed=seed)


async def rollouts(
    engine: LocalEngine, n_groups: int = 3, n: int = 4, seed: int = 0
) -> list[Rollout]:
    src = TASK.prompt_source(seed)
    prompts = [src.next_prompt() for _ in range(n_groups)]
    results = await asyncio.gather(
        *[
            engine.generate(GenerationRequest(i, p, n, seed=seed * 100 + i))
            for i, p in enumerate(prompts)
        ]
    )
    out = []
    for p, r in zip(prompts, results):
        # Spread rewards so that advantages are not all zero.
        rewards = [TASK.reward(p, c) + 0.1 * i for i, c in enumerate(r.completion_texts)]
        out.append(Rollout(r.group_id, p, r, rewards))
    return out


def make_pair(temperature: float = 1.0, top_p: float = 1.0, **loss):
    model, tok = policy()
    engine = LocalEngine(
        copy.deepcopy(model),
        tok,
        GenerationConfig(temperature=temperature, top_p=top_p, max_new_tokens=6),
        num_threads=1,
    )
    trainer = GRPOTrainer(
        model, tok, loss=LossConfig(**loss), temperature=temperature, num_threads=1
    )
    return engine, trainer


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.named_parameters()}


# ------------------------------------------------------------- plumbing
@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_engine_and_trainer_agree_on_logprobs_at_the_same_weights(temperature):
    engine, trainer = make_pair(temperature=temperature)
    assert isinstance(trainer, Trainer)
    metrics = await trainer.train_chunk(await rollouts(engine), step=0)
    assert metrics["logprob_mismatch"] < 1e-4
    assert metrics["logprob_mismatch_max"] < 1e-3
    assert metrics["is_ess"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["clip_frac"] == 0.0
    await engine.close()
    await trainer.close()


async def test_tempered_behavior_logprobs_differ_from_untempered():
    """The engine's log-probs are those of the tempered distribution: a trainer
    scoring at temperature 1 sees a clear mismatch."""
    engine, _ = make_pair(temperature=0.5)
    model, tok = policy()
    untempered = GRPOTrainer(model, tok, temperature=1.0)
    metrics = untempered.train_chunk_sync(await rollouts(engine))
    assert metrics["logprob_mismatch"] > 1e-2
    await engine.close()


async def test_top_p_shows_up_as_mismatch_but_tokens_stay_inside_the_nucleus():
    engine, trainer = make_pair(top_p=0.5)
    metrics = trainer.train_chunk_sync(await rollouts(engine))
    assert metrics["logprob_mismatch"] > 1e-3  # truncation renormalised the probabilities
    assert all(math.isfinite(v) for v in metrics.values())
    await engine.close()


# ----------------------------------------------------------------- steps
@pytest.mark.parametrize("correction", ["none", "tis", "decoupled"])
async def test_a_training_step_changes_parameters_and_version(correction):
    engine, trainer = make_pair(off_policy_correction=correction)
    before = params(trainer.model)
    metrics = await trainer.train_chunk(await rollouts(engine), step=0)
    for key in ("loss", "logprob_mismatch", "clip_frac", "is_ess", "entropy", "advantage_mean"):
        assert math.isfinite(metrics[key]), key
    step = await trainer.finish_step(step=0)
    assert step["grad_norm"] > 0 and math.isfinite(step["loss"])
    assert trainer.version == 1
    after = params(trainer.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)

    weights = await trainer.get_weights()
    assert all(v.device.type == "cpu" for v in weights.values())
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(weights[name], value)
    # a copy: changing it does not touch the trainer's model
    name = "model.embed_tokens.weight"
    weights[name] = weights[name] + 0  # keep a pristine one for the engine below
    trainer_copy = await trainer.get_weights()
    trainer_copy[name].add_(1.0)
    assert torch.equal(trainer.model.state_dict()[name], after[name])
    await engine.update_weights(weights, 1)
    await engine.close()
    await trainer.close()


async def test_wrong_step_number_is_refused():
    engine, trainer = make_pair()
    with pytest.raises(ValueError, match="version 0"):
        await trainer.train_chunk(await rollouts(engine), step=3)
    with pytest.raises(ValueError):
        await trainer.finish_step(step=1)
    await engine.close()


async def test_chunking_does_not_change_the_step():
    """Gradients are summed over tokens and divided by the step's token count, so
    one chunk of three groups == three chunks of one group (== micro-batches of 2)."""
    engine, _ = make_pair()
    data = await rollouts(engine, n_groups=3)
    await engine.close()

    results = []
    for chunks, micro in [([data], 8192), ([data[:1], data[1:2], data[2:]], 8192), ([data], 20)]:
        model, tok = policy()
        trainer = GRPOTrainer(model, tok, micro_batch_tokens=micro)
        for chunk in chunks:
            trainer.train_chunk_sync(chunk)
        step = trainer.finish_step_sync()
        results.append((params(model), step["loss"], step["grad_norm"]))
    ref_params, ref_loss, ref_norm = results[0]
    for p, loss, norm in results[1:]:
        assert loss == pytest.approx(ref_loss, rel=1e-4, abs=1e-6)
        assert norm == pytest.approx(ref_norm, rel=1e-4)
        for k in ref_params:
            assert torch.allclose(p[k], ref_params[k], atol=1e-6), k


async def test_off_policy_data_reports_mismatch_and_lower_ess():
    engine, trainer = make_pair(off_policy_correction="tis", is_cap=2.0)
    data = await rollouts(engine)
    await engine.close()
    g = torch.Generator().manual_seed(0)
    for r in data:  # pretend another policy sampled these tokens
        r.result.completions = [
            dataclasses.replace(c, logprobs=[lp - float(torch.rand((), generator=g))
                                             for lp in c.logprobs])
            for c in r.result.completions
        ]
    metrics = trainer.train_chunk_sync(data)
    assert 0.3 < metrics["logprob_mismatch"] < 0.7
    assert metrics["is_ess"] < 0.99
    assert metrics["is_truncated_frac"] > 0  # some pi/mu above e^0.69 = 2.0


async def test_kl_to_the_frozen_reference():
    engine, trainer = make_pair(kl_coef=0.1)
    data = await rollouts(engine)
    metrics = trainer.train_chunk_sync(data)
    assert metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at first
    trainer.finish_step_sync()
    metrics = trainer.train_chunk_sync(data)
    assert metrics["kl"] > 0
    ref = dict(trainer.ref_model.named_parameters())
    assert all(not p.requires_grad for p in ref.values())
    await engine.close()


async def test_empty_step_keeps_weights():
    _, trainer = make_pair()
    before = params(trainer.model)
    assert "grad_norm" not in trainer.finish_step_sync()
    assert trainer.version == 1
    assert all(torch.equal(before[k], v) for k, v in params(trainer.model).items())


async def test_grad_clip_bounds_the_update_norm_metric_is_pre_clip():
    engine, _ = make_pair()
    data = await rollouts(engine)
    await engine.close()
    model, tok = policy()
    trainer = GRPOTrainer(model, tok, optimizer=OptimizerConfig(grad_clip=1e-6))
    trainer.train_chunk_sync(data)
    metrics = trainer.finish_step_sync()
    assert metrics["grad_norm"] > 1e-6  # reported before clipping


# ------------------------------------------------------------ checkpoints
async def test_state_dict_roundtrip_resumes_identically():
    engine, trainer = make_pair(kl_coef=0.05)
    first = await rollouts(engine, seed=1)
    second = await rollouts(engine, seed=2)
    await engine.close()

    trainer.train_chunk_sync(first)
    trainer.finish_step_sync()
    state = trainer.state_dict()
    trainer.train_chunk_sync(second)
    expected_metrics = trainer.finish_step_sync()
    expected = params(trainer.model)

    model, tok = policy(seed=5)  # different initial weights: all must come from the state
    resumed = GRPOTrainer(model, tok, loss=LossConfig(kl_coef=0.05))
    resumed.load_state_dict(state)
    assert resumed.version == 1
    resumed.train_chunk_sync(second)
    metrics = resumed.finish_step_sync()
    assert metrics["loss"] == pytest.approx(expected_metrics["loss"], rel=1e-5)
    for k, v in params(resumed.model).items():
        assert torch.allclose(v, expected[k], atol=1e-7), k


async def test_a_resumed_optimizer_takes_the_configs_hyper_parameters(caplog):
    # Issue 28, item 1: load_state_dict restored the checkpoint's param groups whole,
    # so lr, betas and weight_decay changed on resume were announced and ignored.
    engine, trainer = make_pair()
    data = await rollouts(engine, seed=1)
    await engine.close()
    trainer.train_chunk_sync(data)
    trainer.finish_step_sync()
    state = trainer.state_dict()
    changed = OptimizerConfig(lr=0.05, betas=(0.8, 0.9), weight_decay=0.1)
    resumed = GRPOTrainer(*policy(seed=5), optimizer=changed)
    with caplog.at_level("INFO", logger="asyncrl.trainers"):
        resumed.load_state_dict(state)
    for group in resumed.optimizer.param_groups:
        assert (group["lr"], group["betas"], group["weight_decay"]) == (0.05, (0.8, 0.9), 0.1)
    # ... over the checkpoint's moments, which stay.
    saved = state["optimizer"]["state"]
    for i, moments in resumed.optimizer.state_dict()["state"].items():
        assert torch.equal(moments["exp_avg"], saved[i]["exp_avg"])
    assert "lr 0.001 -> 0.05, betas (0.9, 0.99) -> (0.8, 0.9), weight_decay 0 -> 0.1" \
        in caplog.text
    assert resumed.state_dict()["optimizer"]["param_groups"][0]["lr"] == 0.05


def test_state_dict_is_a_snapshot():
    _, trainer = make_pair()
    state = trainer.state_dict()
    assert set(state) >= {"model", "optimizer", "version", "torch_rng"}
    name = "model.embed_tokens.weight"
    saved = state["model"][name].clone()
    with torch.no_grad():
        trainer.model.get_parameter(name).add_(1.0)
    assert torch.equal(state["model"][name], saved)


async def test_the_final_state_is_the_state_without_copies_taken_on_the_trainers_thread():
    """Once a run has stopped, the final checkpoint and policy take the trainer's
    tensors as they are (a copy would double the model and optimizer in memory),
    on the trainer's own thread: after any step still running there."""
    engine, trainer = make_pair()
    trainer.train_chunk_sync(await rollouts(engine))
    trainer.finish_step_sync()
    threads = []
    take_state = trainer._state

    def recorded(**kwargs):
        threads.append(threading.current_thread().name)
        return take_state(**kwargs)

    trainer._state = recorded
    final, copied = trainer.final_state_dict(), trainer.state_dict()
    assert threads[0].startswith("asyncrl-trainer") and threads[1] == "MainThread"

    def same(a, b):
        if isinstance(a, torch.Tensor):
            return torch.equal(a, b)
        if isinstance(a, dict):
            return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        return a == b

    assert same(final, copied)
    for name, param in trainer.model.named_parameters():
        assert final["model"][name].data_ptr() == param.data_ptr(), name
        assert copied["model"][name].data_ptr() != param.data_ptr(), name
    moments = [s["exp_avg"] for s in trainer.optimizer.state.values()]
    saved = [s["exp_avg"] for s in final["optimizer"]["state"].values()]
    assert moments and {t.data_ptr() for t in saved} == {t.data_ptr() for t in moments}
    await trainer.close()


def test_tied_embeddings_are_copied_and_saved_once(tmp_path):
    """The quickstart's model ties its input and output embeddings: the
    checkpoint and the weights sent to engines hold that tensor once, and a
    resumed trainer has it tied again."""
    _, trainer = make_pair()
    assert trainer.model.lm_head.weight is trainer.model.model.embed_tokens.weight
    for weights in (trainer.state_dict()["model"], trainer.get_weights_sync()):
        assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    # Weights for an engine on another device (a GPU's path; "meta" here): the same.
    trainer.weights_device = torch.device("meta")
    weights = trainer.get_weights_sync()
    assert weights["lm_head.weight"].device.type == "meta"
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]
    trainer.weights_device = torch.device("cpu")
    model = trainer.state_dict()["model"]
    path = tmp_path / "trainer.pt"
    torch.save({"model": model}, path)
    distinct = {id(t): t for t in model.values()}.values()
    assert path.stat().st_size < sum(t.nbytes for t in distinct) + 64 * 1024
    resumed = GRPOTrainer(*policy(seed=5))
    resumed.load_state_dict({**trainer.state_dict(),
                             "model": torch.load(path, weights_only=True)["model"]})
    assert resumed.model.lm_head.weight is resumed.model.model.embed_tokens.weight
    for k, v in params(resumed.model).items():
        assert torch.equal(v, params(trainer.model)[k]), k


# ----------------------------------------------------------- from config
async def test_build_local_backends_from_a_run_config():
    cfg = RunConfig(policy=PolicyConfig(model=TINY, generation=GenerationConfig(max_new_tokens=3)))
    task = ArithmeticTask(cfg.task)
    engine, trainer = build_local_backends(cfg, task)
    assert engine.model is not trainer.model
    for (k, a), (_, b) in zip(
        engine.model.state_dict().items(), trainer.model.state_dict().items()
    ):
        assert torch.equal(a, b), k
    # built separately they still start from the same weights (same seed)
    e2 = LocalEngine.from_config(cfg.policy, engine_options(cfg),
                                 model=build_policy(cfg.policy, task, seed=cfg.seed)[0],
                                 tokenizer=task.tokenizer)
    t2 = GRPOTrainer.from_options(trainer_options(cfg),
                                  model=build_policy(cfg.policy, task, seed=cfg.seed)[0],
                                  tokenizer=task.tokenizer)
    for (k, a), (_, b) in zip(e2.model.state_dict().items(), t2.model.state_dict().items()):
        assert torch.equal(a, b), k
    src = task.prompt_source(cfg.seed)
    p = src.next_prompt()
    res = await engine.generate(GenerationRequest(0, p, 2))
    rollout = Rollout(0, p, res, [task.reward(p, c) for c in res.completion_texts])
    assert "loss" in await trainer.train_chunk([rollout], step=0)
    for obj in (engine, trainer, e2, t2):
        await obj.close()
