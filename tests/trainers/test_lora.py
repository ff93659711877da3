"""policy.lora: adapters train, engines get merged weights, checkpoints hold the
adapters, the KL reference is the model with its adapters off."""

from __future__ import annotations

import asyncio
import copy
import io

import pytest
import torch
from tests.trainers.shapes import QWEN2_2_LAYERS, TOKENIZER, meta_model, synthetic_rollouts
from tests.trainers.test_grpo import TASK, policy
from torch.utils._pytree import tree_map

from asyncrl.config import GenerationConfig, LoraConfig, LossConfig, OptimizerConfig
from asyncrl.engines import LocalEngine
from asyncrl.errors import ConfigError
from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.memory import LiveTensorBytes
from asyncrl.types import GenerationRequest, Rollout

pytest.importorskip("transformers")
pytest.importorskip("peft")

LORA = LoraConfig(r=4, alpha=8.0)


def lora_pair(**kw) -> tuple[LocalEngine, GRPOTrainer]:
    model, tok = policy()
    engine = LocalEngine(copy.deepcopy(model), tok, GenerationConfig(max_new_tokens=6),
                         num_threads=1)
    kw.setdefault("optimizer", OptimizerConfig(lr=1e-2))
    return engine, GRPOTrainer(model, tok, lora=LORA, num_threads=1, **kw)


async def engine_rollouts(engine: LocalEngine, seed: int) -> list[Rollout]:
    src = TASK.prompt_source(seed)
    prompts = [src.next_prompt() for _ in range(3)]
    results = await asyncio.gather(*[engine.generate(GenerationRequest(i, p, 4, seed=seed + i))
                                     for i, p in enumerate(prompts)])
    return [Rollout(r.group_id, p, r, [0.1 * i for i in range(4)])
            for p, r in zip(prompts, results)]


async def test_only_adapters_train_and_the_engine_samples_the_merged_model():
    engine, trainer = lora_pair(loss=LossConfig(kl_coef=0.1))
    names = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert names and all(".lora_" in n for n in names)
    assert sum(p.numel() for p in trainer.params) == sum(
        p.numel() for n, p in trainer.model.named_parameters() if n in names)
    assert trainer.ref_model is None  # no second copy of the model
    base = {k: v.clone() for k, v in trainer.get_weights_sync().items()}
    assert set(base) == set(engine.model.state_dict())  # the base model's names

    first = trainer.train_chunk_sync(await engine_rollouts(engine, 0))
    assert first["kl"] == pytest.approx(0.0, abs=1e-7)  # adapters start at zero
    trainer.finish_step_sync()
    weights = trainer.get_weights_sync()
    changed = [k for k in weights if not torch.equal(weights[k], base[k])]
    assert changed and all(k.endswith("proj.weight") for k in changed)
    await engine.update_weights(weights, 1)
    # On-policy again: the engine's log-probs are the adapted model's.
    second = trainer.train_chunk_sync(await engine_rollouts(engine, 1))
    assert second["logprob_mismatch_max"] < 1e-5
    assert second["kl"] > 0  # against the model with its adapters off
    await engine.close()
    await trainer.close()


async def test_checkpoint_holds_the_adapters_and_resumes_exactly():
    engine, trainer = lora_pair()
    first, second = await engine_rollouts(engine, 0), await engine_rollouts(engine, 1)
    await engine.close()
    trainer.train_chunk_sync(first)
    trainer.finish_step_sync()
    state = trainer.state_dict()
    assert "model" not in state and set(state["adapter"]) == {
        n for n, p in trainer.model.named_parameters() if p.requires_grad}
    trainer.train_chunk_sync(second)
    trainer.finish_step_sync()

    model, tok = policy()
    resumed = GRPOTrainer(model, tok, lora=LORA, optimizer=OptimizerConfig(lr=1e-2),
                          num_threads=1)
    resumed.load_state_dict(state)
    resumed.train_chunk_sync(second)
    resumed.finish_step_sync()
    for a, b in zip(resumed.params, trainer.params):
        assert torch.equal(a, b)
    other, tok = policy()
    with pytest.raises(ConfigError, match=r"policy\.lora\.r"):
        GRPOTrainer(other, tok, lora=LoraConfig(r=2), num_threads=1).load_state_dict(state)
    full, tok = policy()
    with pytest.raises(ConfigError, match=r"policy\.lora setting"):
        GRPOTrainer(full, tok, num_threads=1).load_state_dict(state)


def test_bad_target_modules_name_the_model_layers():
    model, tok = policy()
    with pytest.raises(ConfigError, match=r"q_proj.*all-linear"):
        GRPOTrainer(model, tok, lora=LoraConfig(target_modules=("attn_c",)))


def test_a_qwen2_shaped_lora_checkpoint_is_a_few_percent_of_the_model():
    """Qwen2.5-0.5B's shape at 2 layers: adapters (r=8 on every projection) and
    their AdamW state after a step, written as a checkpoint is, against the
    model's own weights. The step runs on the meta device (a checkpoint's size
    depends on shapes only); its tensors are given real storage to be written."""
    model = meta_model()
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    trainer = GRPOTrainer(model, TOKENIZER, lora=LoraConfig(r=8), num_threads=1)
    with LiveTensorBytes():  # meta tensors read as zeros on the host
        trainer.train_chunk_sync(synthetic_rollouts([[6, 6]], vocab=QWEN2_2_LAYERS.vocab_size))
        trainer.finish_step_sync()
        state = trainer.state_dict()
    assert len(trainer.optimizer.state) == len(trainer.params)
    buf = io.BytesIO()
    torch.save(tree_map(lambda t: torch.zeros(t.shape, dtype=t.dtype) if isinstance(
        t, torch.Tensor) and t.is_meta else t, state), buf)
    assert buf.tell() <= 0.05 * model_bytes, (buf.tell(), model_bytes)
