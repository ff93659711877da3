"""policy.dtype: float32 untouched, bfloat16/float16 with float32 master weights."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from asyncrl.config import (
    ArithmeticTaskConfig,
    GenerationConfig,
    ModelConfig,
    PolicyConfig,
)
from asyncrl.engines import LocalEngine
from asyncrl.errors import ConfigError
from asyncrl.policy.build import build_policy
from asyncrl.policy.devices import policy_dtype
from asyncrl.tasks import ArithmeticTask
from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.precision import MasterWeights
from asyncrl.types import GenerationRequest, Rollout

pytest.importorskip("transformers")

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
# Operands up to 99: prompts of different lengths (left padding in the engine).
TASK = ArithmeticTask(ArithmeticTaskConfig(max_operand=99, operators="+-"))


def pair(dtype: str, **trainer_kw) -> tuple[LocalEngine, GRPOTrainer]:
    model, tok = build_policy(PolicyConfig(model=TINY, dtype=dtype), TASK)
    engine = LocalEngine(copy.deepcopy(model), tok, GenerationConfig(max_new_tokens=6),
                         num_threads=1)
    return engine, GRPOTrainer(model, tok, num_threads=1, **trainer_kw)


async def rollouts(engine: LocalEngine, seed: int = 0, n_groups: int = 3) -> list[Rollout]:
    src = TASK.prompt_source(seed)
    prompts = [src.next_prompt() for _ in range(n_groups)]
    results = await asyncio.gather(*[
        engine.generate(GenerationRequest(i, p, 4, seed=seed * 100 + i))
        for i, p in enumerate(prompts)
    ])
    return [Rollout(r.group_id, p, r, [TASK.reward(p, c) + 0.1 * i
                                        for i, c in enumerate(r.completion_texts)])
            for p, r in zip(prompts, results)]


# ------------------------------------------------------------------ dtypes
def test_auto_is_float32_on_cpu_and_builds_the_same_weights():
    assert policy_dtype("auto", "cpu") is torch.float32
    assert policy_dtype("bfloat16", "cpu") is torch.bfloat16
    auto, _ = build_policy(PolicyConfig(model=TINY), TASK, seed=3)
    f32, _ = build_policy(PolicyConfig(model=TINY, dtype="float32"), TASK, seed=3)
    bf16, _ = build_policy(PolicyConfig(model=TINY, dtype="bfloat16"), TASK, seed=3)
    for (k, a), b, c in zip(auto.state_dict().items(), f32.state_dict().values(),
                            bf16.state_dict().values()):
        assert a.dtype is torch.float32 and torch.equal(a, b), k
        assert c.dtype is torch.bfloat16 and torch.equal(c, a.to(torch.bfloat16)), k


def test_unusable_devices_are_config_errors_naming_the_key():
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"policy.device=.cuda. but CUDA is not available here"):
            build_policy(PolicyConfig(model=TINY, device="cuda"), TASK)
    with pytest.raises(ConfigError, match=r"policy\.engine_device='gpu0' is not a torch device"):
        build_policy(PolicyConfig(model=TINY, engine_device="gpu0"), TASK)


def test_a_float32_trainer_steps_the_model_itself():
    """float32 is the behaviour of before, bit for bit: no master copies, the
    optimizer owns the model's parameters, nothing extra in checkpoints."""
    _, trainer = pair("float32")
    assert not trainer.precision.mixed and trainer.precision.scaler is None
    model_params = list(trainer.model.parameters())
    assert all(a is b for a, b in zip(trainer.params, model_params))
    assert all(p is q for p, q in zip(trainer.optimizer.param_groups[0]["params"], model_params))
    assert "master" not in trainer.state_dict()


# ------------------------------------------------------------ master weights
async def test_bf16_trains_float32_masters_and_rounds_them_into_the_model():
    engine, trainer = pair("bfloat16")
    assert trainer.precision.mixed
    assert all(p.dtype is torch.float32 for p in trainer.params)
    assert all(p.dtype is torch.bfloat16 for p in trainer.model.parameters())
    data = await rollouts(engine)
    metrics = trainer.train_chunk_sync(data)
    # Gradients live in the float32 masters, not in the bf16 model.
    assert all(p.grad is None for p in trainer.model.parameters())
    assert any(m.grad is not None and m.grad.dtype is torch.float32 for m in trainer.params)
    before = [m.detach().clone() for m in trainer.params]
    step = trainer.finish_step_sync()
    assert step["grad_norm"] > 0 and "skipped_nonfinite_step" not in step
    assert metrics["logprob_mismatch"] < 1e-2
    moved = 0
    for p, m, old in zip(trainer.model.parameters(), trainer.params, before):
        assert torch.equal(p, m.to(torch.bfloat16))  # the model holds the rounded masters
        moved += int(not torch.equal(m, old))
    assert moved > 0
    # Updates smaller than a bf16 ulp accumulate in the masters instead of vanishing.
    assert any(not torch.equal(m, p.float()) for p, m in zip(trainer.model.parameters(),
                                                             trainer.params))
    await engine.close()


def test_master_gradients_accumulate_in_float32():
    """A thousand micro-batches of gradient 1: a bf16 sum would stall at 256
    (257 is not a bf16 number); the float32 masters count all of them."""
    layer = torch.nn.Linear(4, 4, bias=False).to(torch.bfloat16)
    masters = MasterWeights(list(layer.named_parameters()))
    x = torch.ones(1, 4, dtype=torch.bfloat16)
    for _ in range(1000):
        masters.backward(layer(x).sum())
    assert layer.weight.grad is None
    assert torch.equal(masters.master[0].grad, torch.full((4, 4), 1000.0))


async def test_bf16_chunking_does_not_change_the_step():
    """Micro-batch gradients are added into float32 masters: one chunk of three
    groups, three chunks of one group and micro-batches of two accumulate the
    same gradient (up to bf16 rounding inside each backward pass)."""
    engine, _ = pair("bfloat16")
    data = await rollouts(engine)
    await engine.close()
    grads = []
    for chunks, micro in [([data], 8192), ([data[:1], data[1:2], data[2:]], 8192), ([data], 20)]:
        _, trainer = pair("bfloat16", micro_batch_tokens=micro)
        for chunk in chunks:
            trainer.train_chunk_sync(chunk)
        grads.append(torch.cat([m.grad.flatten() for m in trainer.params]))
        assert trainer.finish_step_sync()["grad_norm"] > 0
    for g in grads[1:]:
        assert g.dtype is torch.float32
        assert (g - grads[0]).norm() < 2e-2 * grads[0].norm()


async def test_bf16_weights_reach_the_engine_exactly():
    engine, trainer = pair("bfloat16")
    trainer.train_chunk_sync(await rollouts(engine))
    trainer.finish_step_sync()
    weights = await trainer.get_weights()
    assert all(w.dtype is torch.bfloat16 for w in weights.values())
    await engine.update_weights(weights, 1)
    for name, value in engine.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name]), name
    # float32 weights sent to a bf16 engine are rounded to nearest, like .to(bf16)
    f32 = {k: v.float() + 1e-3 for k, v in weights.items()}
    await engine.update_weights(f32, 2)
    for name, value in engine.model.state_dict().items():
        assert value.dtype is torch.bfloat16
        assert torch.equal(value, f32[name].to(torch.bfloat16)), name
    await engine.close()
    await trainer.close()


async def test_bf16_checkpoint_keeps_the_masters():
    engine, trainer = pair("bfloat16")
    first, second = await rollouts(engine, seed=1), await rollouts(engine, seed=2)
    await engine.close()
    trainer.train_chunk_sync(first)
    trainer.finish_step_sync()
    state = trainer.state_dict()
    assert set(state["master"]) == {n for n, _ in trainer.model.named_parameters()}
    trainer.train_chunk_sync(second)
    trainer.finish_step_sync()

    model, tok = build_policy(PolicyConfig(model=TINY, dtype="bfloat16"), TASK, seed=7)
    resumed = GRPOTrainer(model, tok, num_threads=1)
    resumed.load_state_dict(state)
    resumed.train_chunk_sync(second)
    resumed.finish_step_sync()
    for a, b in zip(resumed.params, trainer.params):
        assert torch.equal(a, b)


async def test_float16_scales_the_loss_and_trains():
    engine, trainer = pair("float16")
    assert trainer.precision.scaler is not None
    trainer.train_chunk_sync(await rollouts(engine))
    step = trainer.finish_step_sync()
    assert step["loss_scale"] > 1 and "skipped_nonfinite_step" not in step
    assert all(p.dtype is torch.float16 for p in trainer.model.parameters())
    assert "grad_scaler" in trainer.state_dict()
    await engine.close()
