"""The device-side decode loop: sampling, no host reads per step, batching, bad logits."""

from __future__ import annotations

import asyncio

import pytest
import torch

from asyncrl.config import GenerationConfig, ModelConfig, PolicyConfig, ReverseTaskConfig
from asyncrl.engines import LocalEngine
from asyncrl.engines.local import decode
from asyncrl.engines.local.token_sampling import sample_tokens, sampling_logprobs
from asyncrl.policy.build import build_policy
from asyncrl.tasks import ReverseTask
from asyncrl.types import GenerationError, GenerationRequest

pytest.importorskip("transformers")

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
# Strings of one length: prompts of one length, batches without padding.
TASK = ReverseTask(ReverseTaskConfig(min_length=4, max_length=4))


def prompts(n: int) -> list:
    src = TASK.prompt_source(0)
    return [src.next_prompt() for _ in range(n)]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_device_sampling_draws_what_multinomial_draws(temperature, top_p):
    """The exponential race consumes the generator exactly like torch.multinomial
    and picks the same tokens: the float32 engine samples as it did before."""
    for trial in range(50):
        logits = torch.randn(16, 11, generator=torch.Generator().manual_seed(trial)) * 3
        ours, theirs = torch.Generator().manual_seed(trial), torch.Generator().manual_seed(trial)
        tokens, chosen = sample_tokens(logits, temperature, top_p, ours)
        logp = sampling_logprobs(logits, temperature, top_p)
        expected = torch.multinomial(logp.exp(), 1, generator=theirs)[:, 0]
        assert torch.equal(tokens, expected)
        assert torch.equal(chosen, logp.gather(1, expected[:, None])[:, 0])
        assert torch.equal(ours.get_state(), theirs.get_state())
    greedy, zero = sample_tokens(logits, 0.0, 1.0, ours)
    assert torch.equal(greedy, logits.argmax(-1)) and not zero.any()


class _Request:
    def __init__(self, n: int) -> None:
        self.num_generations, self.weight_version = n, None


class _Group:
    """The part of the engine's group a DecodeBatch reads: rows from the prompt."""

    def __init__(self, n: int, prompt_ids: list[int], limit: int = 6) -> None:
        self.request, self.prompt_ids, self.aborted = _Request(n), prompt_ids, False
        self.limit = limit

    def open_indices(self) -> list[int]:
        return list(range(self.request.num_generations))

    def context(self, i: int) -> list[int]:
        return self.prompt_ids

    def remaining(self, i: int) -> int:
        return self.limit


class _NoCopy:
    """Stands in for HostCopy on the meta device: the copies never land."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.host = tensors

    def ready(self) -> bool:
        return False


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_a_decode_step_never_reads_device_memory(monkeypatch, temperature):
    """On the meta device every read of a tensor's values raises, so steps that
    run there - prefill, decode, dropping aborted rows, re-prefill after a cache
    invalidation - enqueue work and never wait for the device (transformers'
    forward included, for a batch without padding). The stop flags leave only
    through HostCopy, which on CUDA is a non-blocking copy."""
    monkeypatch.setattr(decode, "HostCopy", _NoCopy)
    model, tok = build_policy(PolicyConfig(model=TINY), TASK)
    model = model.to("meta")
    groups = [_Group(3, [1, 5, 6, 7]), _Group(2, [1, 5, 6, 8])]
    batch = decode.DecodeBatch(groups, pad_id=tok.pad_id, eos_id=tok.eos_id,
                               device=torch.device("meta"),
                               sampling=decode.Sampling(temperature, 0.9, None, 6),
                               cache_epoch=0)
    fwd = decode.ForwardArgs.of(model)
    with torch.inference_mode():
        for _ in range(3):
            batch.step(model, 0, fwd)
            batch.collect()
        groups[1].aborted = True
        batch.collect()
        assert len(batch.rows) == 3 and batch.ids.shape[0] == 3
        batch.step(model, 0, fwd)
        batch.cache = None  # invalidated: the next step re-prefills
        batch.step(model, 0, fwd)
    assert batch.t == 5 and batch.versions == [0] * 5


async def test_groups_with_the_same_overrides_share_a_batch():
    model, tok = build_policy(PolicyConfig(model=TINY), TASK)
    engine = LocalEngine(model, tok, GenerationConfig(max_new_tokens=3), num_threads=1)
    sizes = []
    engine.model.register_forward_hook(lambda m, i, o: sizes.append(o.logits.shape[0]))
    requests = [GenerationRequest(i, p, 2, temperature=0.5, max_new_tokens=2)
                for i, p in enumerate(prompts(3))]
    requests.append(GenerationRequest("own", prompts(1)[0], 2, temperature=0.6))
    results = await asyncio.gather(*[engine.generate(r) for r in requests])
    assert all(len(r.completion_ids) == 2 for r in results)
    assert all(len(c) <= 2 for r in results[:3] for c in r.completion_ids)
    # The three temperature-0.5 groups ran as one batch of 6 rows, the other alone.
    assert sizes[0] + sizes[1] == 8 and set(sizes[:2]) == {6, 2}
    await engine.close()


async def test_non_finite_logits_fail_the_group_not_the_engine():
    model, tok = build_policy(PolicyConfig(model=TINY), TASK)
    engine = LocalEngine(model, tok, GenerationConfig(max_new_tokens=3), num_threads=1)
    handle = engine.model.lm_head.register_forward_hook(
        lambda m, i, o: torch.full_like(o, float("nan")))
    with pytest.raises(GenerationError, match="non-finite log-probs"):
        await engine.generate(GenerationRequest("nan", prompts(1)[0], 2))
    handle.remove()
    res = await engine.generate(GenerationRequest("ok", prompts(1)[0], 2))
    assert len(res.completion_ids) == 2
    await engine.close()


async def test_rows_leave_the_batch_as_they_finish():
    """A row that stops is dropped from the batch (its compute ends there)."""
    model, tok = build_policy(PolicyConfig(model=TINY), TASK)
    engine = LocalEngine(model, tok, GenerationConfig(max_new_tokens=8), num_threads=1)
    sizes = []
    engine.model.register_forward_hook(lambda m, i, o: sizes.append(o.logits.shape[0]))
    res = await engine.generate(GenerationRequest("g", prompts(1)[0], 16, seed=3))
    lengths = sorted(len(c) for c in res.completion_ids)
    assert lengths[0] < lengths[-1]  # a random policy stops at different times
    # Step t decodes exactly the rows still running after t tokens.
    assert sizes == [sum(n > t for n in lengths) for t in range(lengths[-1])]
    await engine.close()
