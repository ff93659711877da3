"""LocalEngine fills the per-token record: the weight version of every token
(checked against the weights that really sampled it), exact continuation after
a sync with recomputed KV, finish reasons, and partial completions read,
handed back at an abort and continued bit for bit."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from asyncrl.config import GenerationConfig, PolicyConfig
from asyncrl.engines import LocalEngine, sampling_logprobs
from asyncrl.policy.build import build_policy
from asyncrl.types import Completion, GenerationRequest, GroupAborted, GroupResult
from tests.engines.test_local_engine import TASK, TINY, bias_token, prompts, signal_first_forward

pytest.importorskip("transformers")

TEMPERATURE = 0.9


def engine_and_models(recompute: bool, max_new_tokens: int = 24):
    """An engine that never ends early (EOS forbidden), a copy of its first
    weights, and other weights to sync to."""
    model, tok = build_policy(PolicyConfig(model=TINY), TASK, seed=0)
    first = copy.deepcopy(model).eval()
    other, _ = build_policy(PolicyConfig(model=TINY), TASK, seed=1)
    engine = LocalEngine(model, tok, GenerationConfig(temperature=TEMPERATURE,
                                                      max_new_tokens=max_new_tokens),
                         num_threads=1, recompute_kv_on_update=recompute)
    for m in (engine.model, first, other):  # the same logits everywhere: no EOS
        m.lm_head.register_forward_hook(_no_eos(tok.eos_id))
    return engine, first, other.eval()


def _no_eos(eos: int):
    def hook(module, inputs, output):
        output = output.clone()
        output[..., eos] -= 100.0
        return output
    return hook


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, prompt_ids: list[int], c: Completion) -> torch.Tensor:
    """Log-probs of the completion's tokens under ``model``, all KV recomputed."""
    seq = torch.tensor([prompt_ids + c.token_ids])
    logits = model(input_ids=seq).logits[0, len(prompt_ids) - 1 : -1]
    logp = sampling_logprobs(logits, TEMPERATURE, 1.0)
    return logp.gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]


async def spanning_group(recompute: bool) -> tuple[GroupResult, dict[int, torch.nn.Module]]:
    engine, first, other = engine_and_models(recompute)
    started = signal_first_forward(engine)
    task = asyncio.create_task(engine.generate(GenerationRequest("g", prompts(1)[0], 4)))
    await started.wait()
    await engine.update_weights(copy.deepcopy(other.state_dict()), 1)
    result = await task
    await engine.close()
    return result, {0: first, 1: other}


@pytest.mark.parametrize("recompute", [True, False])
async def test_every_token_reports_the_weights_that_sampled_it(recompute):
    """A sync lands mid-group: each completion's versions switch from 0 to 1 at one
    token. Recomputing every token's log-prob under the version the record names
    (all KV recomputed) gives the engine's behaviour log-prob to 1e-3 for every
    token with recompute_kv_on_update - the tokens before the switch under the
    old weights, those after it under the new - and not without it (there the
    first tokens after the sync were sampled over KV of the old weights)."""
    result, models = await spanning_group(recompute)
    assert (result.start_weight, result.end_weight) == (0, 1)
    after_sync = []
    for c in result.completions:
        assert c.finish_reason == "length" and len(c) == 24
        (v0, n0), (v1, n1) = c.versions  # one switch, inside the completion
        assert (v0, v1) == (0, 1) and n0 >= 1 and n1 >= 1
        behavior = torch.tensor(c.logprobs)
        before = teacher_forced(models[0], result.prompt_ids, c)[:n0]
        assert torch.allclose(before, behavior[:n0], atol=1e-4)
        # The switch is where the record says: under the old weights the first
        # token after it would have had another log-prob.
        assert abs(float(before[-1] - behavior[n0 - 1])) <= 1e-4
        assert abs(float(teacher_forced(models[0], result.prompt_ids, c)[n0]
                         - behavior[n0])) > 1e-2
        after_sync.append((teacher_forced(models[1], result.prompt_ids, c)[n0:]
                           - behavior[n0:]).abs().max())
    worst = float(max(after_sync))
    if recompute:
        assert worst <= 1e-3
    else:
        assert worst > 1e-3


async def test_finish_reasons_stop_and_length():
    engine, _, _ = engine_and_models(recompute=False, max_new_tokens=5)
    req = GenerationRequest("long", prompts(1)[0], 3)
    long = await engine.generate(req)
    assert long.finish_reasons == ["length"] * 3 and {len(c) for c in long.completions} == {5}
    handle = bias_token(engine, engine.tokenizer.eos_id, 300.0)
    short = await engine.generate(GenerationRequest("short", prompts(1)[0], 3))
    handle.remove()
    assert short.finish_reasons == ["stop"] * 3
    assert short.completion_ids == [[engine.tokenizer.eos_id]] * 3
    assert short.completion_texts == [""] * 3  # the final EOS is not text
    await engine.close()


async def test_partial_tokens_are_read_handed_back_and_continued_exactly():
    engine, first, _ = engine_and_models(recompute=False, max_new_tokens=30)
    prompt = prompts(1)[0]
    started = signal_first_forward(engine)
    task = asyncio.create_task(engine.generate(GenerationRequest("p", prompt, 3, seed=5)))
    await started.wait()
    snap = (await engine.snapshot(["p", "not-there"]))["p"]
    assert not snap.finished and snap.start_weight == 0
    assert all(1 <= len(c) < 30 for c in snap.completions)
    await engine.abort(["p"])
    with pytest.raises(GroupAborted) as stopped:
        await task
    partial = stopped.value.partial
    assert isinstance(partial, GroupResult) and not partial.finished
    for early, late in zip(snap.completions, partial.completions):
        assert late.token_ids[: len(early)] == early.token_ids  # the snapshot was a prefix
        assert late.logprobs[: len(early)] == early.logprobs
        assert late.finish_reason is None

    # Continued: the same tokens first, bit for bit, then new ones up to the limit
    # (max_new_tokens counts the prefix), sampled from a re-prefill of prompt + prefix.
    done = await engine.generate(GenerationRequest("p", prompt, 3, prefix=partial))
    assert done.finished and done.start_weight == 0
    for kept, whole in zip(partial.completions, done.completions):
        n = len(kept)
        assert whole.token_ids[:n] == kept.token_ids and whole.logprobs[:n] == kept.logprobs
        assert len(whole) == 30 and whole.finish_reason == "length"
        assert whole.version_list() == [0] * 30
        forced = teacher_forced(first, done.prompt_ids, whole)
        assert torch.allclose(forced[n:], torch.tensor(whole.logprobs[n:]), atol=1e-4)

    # A prefix that already ended comes back as it is, without generating.
    again = await engine.generate(GenerationRequest("p", prompt, 3, prefix=done))
    assert again.completion_ids == done.completion_ids
    with pytest.raises(ValueError, match="prefix has 3 completions"):
        await engine.generate(GenerationRequest("q", prompt, 2, prefix=done))
    await engine.close()
