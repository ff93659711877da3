"""The CUDA path: bf16 by default, weights on the device, streams, no syncs per step.

Skipped without a CUDA device (the CPU suite covers the same code with the
streams and copies as no-ops); run them on a GPU machine with
``pytest tests/gpu`` (benchmarks/gpu/run_on_device.sh does).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.config import (
    GenerationConfig,
    GRPOConfig,
    ModelConfig,
    PolicyConfig,
    ReverseTaskConfig,
    RunConfig,
)
from asyncrl.engines.local import decode
from asyncrl.policy.build import build_policy
from asyncrl.policy.devices import worker_executor
from asyncrl.run.backends import build_local_backends
from asyncrl.tasks import build_task
from asyncrl.types import GenerationRequest, Rollout

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
pytest.importorskip("transformers")

SMALL = ModelConfig(hidden_size=128, num_layers=2, num_heads=4, intermediate_size=256)
TASK_CFG = ReverseTaskConfig(min_length=8, max_length=8)


def run_config(**policy) -> RunConfig:
    return RunConfig(
        task=TASK_CFG,
        grpo=GRPOConfig(num_prompts_per_step=4, num_generations_per_prompt=8),
        policy=PolicyConfig(device="cuda", model=SMALL,
                            generation=GenerationConfig(max_new_tokens=10), **policy),
    )


async def one_step(cfg: RunConfig) -> dict[str, float]:
    task = build_task(cfg.task)
    engine, trainer = build_local_backends(cfg, task)
    src = task.prompt_source(0)
    prompts = [src.next_prompt() for _ in range(4)]
    results = await asyncio.gather(
        *[engine.generate(GenerationRequest(i, p, 8)) for i, p in enumerate(prompts)])
    data = [Rollout(r.group_id, p, r, [task.reward(p, c) for c in r.completion_texts])
            for p, r in zip(prompts, results)]
    metrics = await trainer.train_chunk(data, step=0)
    metrics.update(await trainer.finish_step(step=0))
    weights = await trainer.get_weights()
    assert all(w.device == engine.device for w in weights.values())
    await engine.update_weights(weights, 1)
    for name, value in engine.model.state_dict().items():
        assert torch.equal(value, trainer.model.state_dict()[name].to(engine.device)), name
    await engine.close()
    await trainer.close()
    return metrics


async def test_bf16_by_default_on_cuda_with_a_small_on_policy_mismatch():
    cfg = run_config()
    model, _ = build_policy(cfg.policy, build_task(cfg.task))
    assert next(model.parameters()).dtype is torch.bfloat16
    metrics = await one_step(cfg)
    print(f"bf16 on-policy logprob_mismatch on CUDA: {metrics['logprob_mismatch']:.3e} "
          f"(max {metrics['logprob_mismatch_max']:.3e})")
    assert metrics["logprob_mismatch"] < 5e-2
    assert metrics["grad_norm"] > 0


async def test_float32_on_cuda_agrees_closely():
    metrics = await one_step(run_config(dtype="float32"))
    assert metrics["logprob_mismatch"] < 1e-3


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
async def test_engine_on_a_second_device():
    metrics = await one_step(run_config(engine_device="cuda:1"))
    assert metrics["logprob_mismatch"] < 5e-2


def test_workers_launch_on_streams_of_their_own():
    device = torch.device("cuda")
    streams = []
    for name in ("engine", "trainer"):
        executor, stream = worker_executor(name, 1, device)
        current = executor.submit(torch.cuda.current_stream, device).result()
        executor.shutdown()
        assert current == stream and current != torch.cuda.default_stream(device)
        streams.append(stream)
    assert streams[0] != streams[1]


def test_decode_steps_never_synchronise():
    """With torch's sync debug mode on "error", any host synchronisation in a
    decoding step (prefill, decode, reading landed flags, dropping finished rows)
    raises. The batch has no padding (see docs/gpu.md for padded batches)."""
    cfg = run_config()
    model, tok = build_policy(cfg.policy, build_task(cfg.task))
    src = build_task(cfg.task).prompt_source(0)

    class Group:
        def __init__(self, prompt_ids: list[int]) -> None:
            self.request = GenerationRequest(0, src.next_prompt(), 8)
            self.prompt_ids, self.aborted = prompt_ids, False

    groups = [Group([tok.bos_id, *tok.encode(src.next_prompt().text)]) for _ in range(4)]
    rng = torch.Generator(torch.device("cuda")).manual_seed(0)
    batch = decode.DecodeBatch(groups, pad_id=tok.pad_id, eos_id=tok.eos_id,
                               device=torch.device("cuda"),
                               sampling=decode.Sampling(1.0, 1.0, rng, 10), cache_epoch=0)
    fwd = decode.ForwardArgs.of(model)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.inference_mode():
            for _ in range(9):
                batch.step(model, 0, fwd)
                batch.collect()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert batch.t == 9
