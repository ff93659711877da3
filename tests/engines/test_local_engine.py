"""LocalEngine: batching, stopping, sampling distribution, seeds, aborts, weight updates."""

from __future__ import annotations

import asyncio
import copy
import math

import pytest
import torch

from asyncrl.config import ArithmeticTaskConfig, GenerationConfig, ModelConfig, PolicyConfig
from asyncrl.engines import (
    InProcessTransport,
    LocalEngine,
    RolloutEngine,
    WeightTransport,
    WeightUpdate,
    sampling_logprobs,
)
from asyncrl.errors import TokenizationError
from asyncrl.policy.build import build_policy
from asyncrl.tasks import ArithmeticTask
from asyncrl.types import GenerationError, GenerationRequest, GroupAborted, Prompt

pytest.importorskip("transformers")

TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
# Operands up to 999: prompts of different lengths, so batches need left padding.
TASK = ArithmeticTask(ArithmeticTaskConfig(max_operand=999, operators="+-"))


def make_engine(seed: int = 0, **generation) -> LocalEngine:
    model, tok = build_policy(PolicyConfig(model=TINY), TASK, seed=seed)
    return LocalEngine(model, tok, GenerationConfig(**generation), num_threads=1)


def prompts(n: int, seed: int = 0) -> list[Prompt]:
    src = TASK.prompt_source(seed)
    return [src.next_prompt() for _ in range(n)]


def bias_token(engine: LocalEngine, token: int, value: float):
    """Add ``value`` to one logit of the engine's model (a forward hook on the
    real output layer): +100 forces the token, -100 forbids it."""

    def hook(module, inputs, output):
        output = output.clone()
        output[..., token] += value
        return output

    return engine.model.lm_head.register_forward_hook(hook)


def signal_first_forward(engine: LocalEngine) -> asyncio.Event:
    """An event set (thread-safely) once the engine's model ran a forward pass."""
    loop = asyncio.get_running_loop()
    event = asyncio.Event()

    def hook(*_):  # returns None: the forward's output stays unchanged
        loop.call_soon_threadsafe(event.set)

    engine.model.register_forward_hook(hook)
    return event


# ----------------------------------------------------------------- sampling
def test_sampling_logprobs_temperature_and_top_p_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.allclose(
        sampling_logprobs(logits, 1.0, 1.0).exp(), torch.tensor([[0.5, 0.3, 0.2]])
    )
    # temperature 0.5 squares the probabilities before renormalising
    sq = torch.tensor([0.25, 0.09, 0.04]) / 0.38
    assert torch.allclose(sampling_logprobs(logits, 0.5, 1.0).exp()[0], sq)
    # top_p 0.6: mass above token 1 is 0.5 < 0.6 (kept), above token 2 is 0.8 (dropped)
    p = sampling_logprobs(logits, 1.0, 0.6).exp()[0]
    assert torch.allclose(p, torch.tensor([0.625, 0.375, 0.0]))
    # top_p 0.45: mass above token 1 is 0.5, not below 0.45: only the top token stays
    assert torch.allclose(sampling_logprobs(logits, 1.0, 0.45).exp()[0], torch.tensor([1.0, 0, 0]))


# ----------------------------------------------------------------- batching
async def test_concurrent_groups_are_batched_and_complete():
    engine = make_engine(max_new_tokens=6)
    assert isinstance(engine, RolloutEngine)
    forwards = []
    engine.model.register_forward_hook(lambda m, i, o: forwards.append(i))
    ps = prompts(5)
    sizes = [3, 1, 4, 2, 5]
    results = await asyncio.gather(
        *[
            engine.generate(GenerationRequest(("g", i), p, n))
            for i, (p, n) in enumerate(zip(ps, sizes))
        ]
    )
    eos = engine.tokenizer.eos_id
    for i, (p, n, res) in enumerate(zip(ps, sizes, results)):
        assert res.group_id == ("g", i)
        assert res.prompt_ids == [engine.tokenizer.bos_id, *engine.tokenizer.encode(p.text)]
        assert (
            len(res.completion_ids) == len(res.behavior_logprobs) == len(res.completion_texts) == n
        )
        for ids, lps, text in zip(res.completion_ids, res.behavior_logprobs, res.completion_texts):
            assert 1 <= len(ids) <= 6 and len(lps) == len(ids)
            assert all(lp <= 0 and math.isfinite(lp) for lp in lps)
            assert eos not in ids[:-1]  # nothing after EOS
            assert len(ids) == 6 or ids[-1] == eos
            assert text == engine.tokenizer.decode(ids)
        assert res.start_weight == res.end_weight == 0
    # All 15 rows went through shared forward passes: at most one prefill plus
    # one step per token, not one pass per group.
    assert len(forwards) <= 6
    await engine.close()


async def test_eos_ends_a_completion():
    engine = make_engine(max_new_tokens=8)
    bias_token(engine, engine.tokenizer.eos_id, +100.0)
    res = await engine.generate(GenerationRequest(0, prompts(1)[0], 4))
    assert res.completion_ids == [[engine.tokenizer.eos_id]] * 4
    assert res.completion_texts == [""] * 4
    assert all(lp[0] == pytest.approx(0.0, abs=1e-6) for lp in res.behavior_logprobs)
    await engine.close()


async def test_max_new_tokens_ends_a_completion():
    engine = make_engine(max_new_tokens=5)
    bias_token(engine, engine.tokenizer.eos_id, -100.0)
    res = await engine.generate(GenerationRequest(0, prompts(1)[0], 3))
    assert [len(c) for c in res.completion_ids] == [5, 5, 5]
    await engine.close()


async def test_max_batch_sequences_splits_work_but_all_groups_finish():
    engine = make_engine(max_new_tokens=3, max_batch_sequences=4)
    results = await asyncio.gather(
        *[engine.generate(GenerationRequest(i, p, 3)) for i, p in enumerate(prompts(4))]
    )
    assert [len(r.completion_ids) for r in results] == [3, 3, 3, 3]
    # a group larger than the whole budget still runs
    res = await engine.generate(GenerationRequest("big", prompts(1)[0], 6))
    assert len(res.completion_ids) == 6
    await engine.close()


# ------------------------------------------------------- behavior log-probs
async def test_behavior_logprobs_are_those_of_the_tempered_nucleus():
    engine = make_engine(max_new_tokens=4, temperature=0.7, top_p=0.9)
    res = await engine.generate(GenerationRequest(0, prompts(1)[0], 6))
    for ids, lps in zip(res.completion_ids, res.behavior_logprobs):
        seq = torch.tensor([res.prompt_ids + ids])
        with torch.no_grad():
            logits = engine.model(input_ids=seq).logits[0, len(res.prompt_ids) - 1 : -1]
        expected = sampling_logprobs(logits, 0.7, 0.9).gather(1, torch.tensor(ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(lps), expected, atol=1e-4)
    await engine.close()


# ---------------------------------------------------------- reproducibility
async def test_seeded_group_does_not_depend_on_batch_composition():
    ps = prompts(6)
    target = GenerationRequest("t", ps[0], 5, seed=1234)

    alone_engine = make_engine(max_new_tokens=6)
    alone = await alone_engine.generate(target)
    await alone_engine.close()

    crowded_engine = make_engine(max_new_tokens=6)
    others = [GenerationRequest(i, p, 4) for i, p in enumerate(ps[1:4])]
    others += [GenerationRequest(f"s{i}", p, 3, seed=i) for i, p in enumerate(ps[4:])]
    results = await asyncio.gather(
        *[crowded_engine.generate(r) for r in [*others[:2], target, *others[2:]]]
    )
    crowded = results[2]
    await crowded_engine.close()

    assert crowded.completion_ids == alone.completion_ids
    assert crowded.behavior_logprobs == alone.behavior_logprobs
    # a different seed gives different samples
    other_engine = make_engine(max_new_tokens=6)
    other = await other_engine.generate(GenerationRequest("t", ps[0], 5, seed=99))
    await other_engine.close()
    assert other.completion_ids != alone.completion_ids


async def test_cache_invalidation_recomputes_the_same_distribution():
    p = prompts(1)[0]
    req = GenerationRequest("g", p, 4, seed=7)
    plain = make_engine(max_new_tokens=10)
    bias_token(plain, plain.tokenizer.eos_id, -100.0)
    expected = await plain.generate(req)
    await plain.close()

    engine = make_engine(max_new_tokens=10)
    bias_token(engine, engine.tokenizer.eos_id, -100.0)
    started = signal_first_forward(engine)
    task = asyncio.create_task(engine.generate(req))
    await started.wait()
    await engine.invalidate_cache()  # next step re-prefills prompt + tokens so far
    res = await task
    await engine.close()
    assert res.completion_ids == expected.completion_ids
    for a, b in zip(res.behavior_logprobs, expected.behavior_logprobs):
        assert a == pytest.approx(b, abs=1e-5)


# ------------------------------------------------------------------- aborts
async def test_abort_raises_group_aborted_and_spares_other_groups():
    engine = make_engine(max_new_tokens=40)
    bias_token(engine, engine.tokenizer.eos_id, -100.0)
    started = signal_first_forward(engine)
    ps = prompts(2)
    doomed = asyncio.create_task(engine.generate(GenerationRequest("doomed", ps[0], 4)))
    survivor = asyncio.create_task(engine.generate(GenerationRequest("ok", ps[1], 2)))
    await started.wait()
    await engine.abort(["doomed", "unknown-id"])
    with pytest.raises(GroupAborted):
        await doomed
    res = await survivor
    assert [len(c) for c in res.completion_ids] == [40, 40]
    await engine.close()


async def test_abort_of_a_queued_group_and_cancellation():
    engine = make_engine(max_new_tokens=4)
    queued = asyncio.create_task(engine.generate(GenerationRequest("q", prompts(1)[0], 2)))
    await asyncio.sleep(0)  # let generate() enqueue the group
    await engine.abort(["q"])
    with pytest.raises(GroupAborted):
        await queued

    cancelled = asyncio.create_task(engine.generate(GenerationRequest("c", prompts(1)[0], 2)))
    await asyncio.sleep(0)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    # the engine keeps serving, and the id may be used again (a retry)
    res = await engine.generate(GenerationRequest("c", prompts(1)[0], 2))
    assert len(res.completion_ids) == 2
    await engine.close()


async def test_close_aborts_inflight_groups_and_refuses_new_ones():
    engine = make_engine(max_new_tokens=50)
    bias_token(engine, engine.tokenizer.eos_id, -100.0)
    started = signal_first_forward(engine)
    inflight = asyncio.create_task(engine.generate(GenerationRequest("x", prompts(1)[0], 2)))
    await started.wait()
    await engine.close()
    with pytest.raises(GroupAborted):
        await inflight
    with pytest.raises(RuntimeError, match="close"):
        await engine.generate(GenerationRequest("y", prompts(1)[0], 1))
    await engine.close()  # idempotent


async def test_failed_forward_fails_its_groups_with_generation_error():
    engine = make_engine(max_new_tokens=4)
    calls = []

    def explode(module, inputs, output):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("boom")

    handle = engine.model.lm_head.register_forward_hook(explode)
    with pytest.raises(GenerationError, match="boom"):
        await engine.generate(GenerationRequest("a", prompts(1)[0], 2))
    handle.remove()
    res = await engine.generate(GenerationRequest("a", prompts(1)[0], 2))  # the retry works
    assert len(res.completion_ids) == 2
    await engine.close()


# ------------------------------------------------------------ weight updates
async def test_update_weights_sets_version_weights_and_end_weight():
    engine = make_engine(max_new_tokens=30)
    bias_token(engine, engine.tokenizer.eos_id, -100.0)
    new_model, _ = build_policy(PolicyConfig(model=TINY), TASK, seed=1)
    new_weights = copy.deepcopy(new_model.state_dict())
    started = signal_first_forward(engine)

    spanning = asyncio.create_task(engine.generate(GenerationRequest("span", prompts(1)[0], 2)))
    await started.wait()
    await engine.update_weights(new_weights, 1)
    assert engine.weight_version == 1
    for name, tensor in engine.model.state_dict().items():
        assert torch.equal(tensor, new_weights[name]), name
    res = await spanning
    assert res.start_weight == 0 and res.end_weight == 1

    after = await engine.generate(GenerationRequest("after", prompts(1)[0], 1))
    assert after.start_weight == after.end_weight == 1
    with pytest.raises(ValueError, match="go back"):
        await engine.update_weights(new_weights, 0)
    await engine.close()


async def test_a_failing_tokenizer_fails_the_group_instead_of_hanging():
    engine = make_engine(max_new_tokens=2)

    class BrokenDecode(type(engine.tokenizer)):
        def decode(self, ids):
            raise UnicodeError("cannot decode")

    engine.tokenizer = BrokenDecode(engine.tokenizer.chars)
    with pytest.raises(TokenizationError, match="cannot decode"):  # data: the completion's
        await engine.generate(GenerationRequest("a", prompts(1)[0], 2))
    engine.tokenizer = type(engine.tokenizer).__mro__[1](engine.tokenizer.chars)
    res = await engine.generate(GenerationRequest("a", prompts(1)[0], 2))  # recovered
    assert len(res.completion_ids) == 2
    await engine.close()


async def test_a_scheduler_that_dies_fails_its_groups_and_a_new_one_starts():
    # Supervision: whatever ends the scheduler task (here a cancellation from
    # outside), the groups waiting on it fail instead of waiting forever.
    engine = make_engine(max_new_tokens=30)
    bias_token(engine, engine.tokenizer.eos_id, -100.0)
    started = signal_first_forward(engine)
    waiting = asyncio.create_task(engine.generate(GenerationRequest("a", prompts(1)[0], 2)))
    await started.wait()
    engine._scheduler.cancel()
    with pytest.raises(GenerationError, match="scheduler stopped: it was cancelled"):
        await waiting
    engine.generation = GenerationConfig(max_new_tokens=2)
    res = await engine.generate(GenerationRequest("b", prompts(1)[0], 2))  # a fresh scheduler
    assert len(res.completion_ids) == 2
    await engine.close()


async def test_a_request_overrides_temperature_and_length_greedy_at_zero():
    engine = make_engine(max_new_tokens=6, temperature=1.0)
    p = prompts(1)[0]
    greedy = [await engine.generate(GenerationRequest(f"g{i}", p, 3, temperature=0.0,
                                                      max_new_tokens=2)) for i in range(2)]
    # Greedy decoding: every completion of both requests is the same argmax path,
    # cut at the request's own limit (or earlier at EOS), with probability one.
    paths = {tuple(c) for r in greedy for c in r.completion_ids}
    assert len(paths) == 1 and all(len(c) <= 2 for c in paths)
    assert all(lp == 0.0 for r in greedy for row in r.behavior_logprobs for lp in row)
    # Without overrides the same engine samples with its own settings.
    sampled = await engine.generate(GenerationRequest("s", p, 8))
    assert max(len(c) for c in sampled.completion_ids) <= 6
    assert any(lp < 0 for row in sampled.behavior_logprobs for lp in row)
    await engine.close()


def test_weights_reach_the_model_through_its_in_process_transport() -> None:
    """The local engine's weight sync is its WeightTransport (route in_process):
    it refuses an update kind it does not carry, before anything is loaded."""
    engine = make_engine()
    transport = engine.transport
    assert isinstance(transport, InProcessTransport) and isinstance(transport, WeightTransport)
    assert transport.route == "in_process" and transport.kinds == {"full"}
    new = {k: torch.full_like(v, 0.5) for k, v in engine.model.state_dict().items()}
    asyncio.run(engine.update_weights(new, 1))
    assert engine.weight_version == 1
    assert all(torch.equal(v, new[k]) for k, v in engine.model.state_dict().items())
    with pytest.raises(ValueError, match="carries \\['full'\\] updates, not 'adapters'"):
        asyncio.run(transport.stage(WeightUpdate(2, {}, kind="adapters")))
    asyncio.run(engine.close())
