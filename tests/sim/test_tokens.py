"""The simulator's token model: per-token weight versions, token staleness and
masks, and the long-tail acceptance workload (virtual time, so it is fast)."""

from __future__ import annotations

import asyncio
import collections
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from asyncrl.config import LossConfig, load_config
from asyncrl.sim.backends import SimEngine
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import Constant, Tokens, Work
from asyncrl.sim.runner import simulate
from asyncrl.sim.sharing import SharedDecoder
from asyncrl.sim.tokens import (
    Placeholders,
    completion_lengths,
    count_masked,
    last_version,
    tokens_by_version,
    version_spans,
)
from asyncrl.trainers.masks import MaskStats, token_masks
from asyncrl.types import Completion, GenerationRequest, GroupResult, Prompt, Rollout
from tests.sim.helpers import sim_config
from tests.vtime import advance

ROOT = Path(__file__).resolve().parents[2]


def request(i: int, n: int = 2) -> GenerationRequest:
    return GenerationRequest(group_id=f"g{i}", prompt=Prompt(i, ""), num_generations=n,
                             attempt=1, start_weight=0)


def test_an_update_mid_generation_splits_the_tokens_where_it_landed() -> None:
    # 10 s at 2 tokens/s: token j is sampled at 0.5 * (j + 1). Version 1 lands at
    # t = 3 (sync 2.5 s from t = 0.5), version 2 at t = 7.5.
    engine = SimEngine(Constant(10.0), rollout_slots=1, weight_sync_s=2.5, tokens_per_s=2.0)

    async def main() -> GroupResult:
        gen = asyncio.ensure_future(engine.generate(request(0)))
        await advance(0.5)
        await engine.update_weights(None, 1)
        await advance(2.0)
        await engine.update_weights(None, 2)
        return await gen

    result = run_virtual(main(), loop="jump")
    # 6 tokens by t = 3 (the 6th at exactly 3.0 keeps the old version), 15 by 7.5.
    assert [c.versions for c in result.completions] == [((0, 6), (1, 9), (2, 5))] * 2
    assert result.start_weight == 0 and result.end_weight == 2
    assert len(result.completions[0].token_ids) == len(result.completions[0].logprobs) == 20


def test_a_group_that_starts_after_an_update_has_only_the_new_version() -> None:
    engine = SimEngine(Constant(4.0), rollout_slots=1, weight_sync_s=1.0, tokens_per_s=1.0)

    async def main() -> GroupResult:
        await engine.update_weights(None, 1)
        return await engine.generate(request(0))

    result = run_virtual(main(), loop="jump")
    assert result.completions[0].versions == ((1, 4),) and result.end_weight == 1


def test_spans_cost_the_updates_not_the_tokens() -> None:
    # A million tokens and three updates: three spans, built without a list per token.
    work = Work(latency=1000.0, base_s=0.0, token_s=0.001, longest=1_000_000, mean=1e6)
    spans = version_spans(1_000_000, work, 0.0, 4, [(250.0, 5), (500.0, 6), (2000.0, 7)])
    assert spans == ((4, 250_000), (5, 250_000), (6, 500_000))
    zeros = Placeholders()
    ids, logprobs = zeros.ids(1_000_000), zeros.logprobs(1_000_000)
    assert len(ids) == 1_000_000 and ids[-1] == 0 and list(ids[2:5]) == [0, 0, 0]
    assert logprobs[7] == 0.0 and zeros.ids(3).tolist() == [0, 0, 0]
    with pytest.raises(IndexError):
        ids[1_000_000]
    with pytest.raises(TypeError):  # the record's lists are read-only
        ids[0] = 1  # type: ignore[index]
    Completion(ids, logprobs, spans, "stop")  # type: ignore[arg-type]


def test_completion_lengths_keep_the_longest_and_the_mean() -> None:
    assert completion_lengths(Work(1.0, 0.0, 0.1, 10, 10.0), 4) == [10, 10, 10, 10]
    assert completion_lengths(Work(1.0, 0.0, 0.1, 10, 4.0), 4) == [10, 2, 2, 2]
    assert completion_lengths(Work(1.0, 0.0, 0.1, 10, 5.0), 4) == [10, 4, 3, 3]
    assert completion_lengths(Work(1.0, 0.0, 0.1, 10, 1.0), 4) == [10, 1, 1, 1]
    assert completion_lengths(Work(1.0, 0.0, 0.1, 7, 3.0), 1) == [7]


def test_the_tokens_latency_grows_with_the_load_and_times_each_token() -> None:
    model = Tokens(((10, 6.0),), base_s=1.0, per_token_s=0.5, per_token_per_group_s=0.25)
    alone, loaded = model.work((10, 6.0), 1, 20.0), model.work((10, 6.0), 3, 20.0)
    assert (alone.latency, loaded.latency) == (6.0, 11.0)
    assert loaded.base_s == 1.0 and loaded.token_s == 1.0
    assert model.mean_at(3) == 11.0 and model.mean_tokens(20.0) == 6.0
    # The first token comes at base_s + token_s: an update at t = 2.5 keeps one.
    assert version_spans(10, alone, 0.0, 0, [(2.5, 1)]) == ((0, 3), (1, 7))


def _random_rollout(rng: random.Random, i: int) -> Rollout:
    completions = []
    for _ in range(3):
        n = rng.randint(0, 6)
        versions = sorted(rng.randint(0, 6) for _ in range(n))
        mask = [rng.randint(0, 1) for _ in range(n)] if rng.random() < 0.3 else None
        reason = rng.choice(["stop", "length"])
        completions.append(Completion.of([1] * n, [0.0] * n, versions, reason, loss_mask=mask))
    return Rollout(i, Prompt(i, ""), GroupResult(i, [0], completions, 0, [0.0] * 3), [0.0] * 3)


@pytest.mark.parametrize("bound", [None, 0, 2])
@pytest.mark.parametrize("truncated", ["keep", "mask", "zero_reward"])
def test_masks_counted_per_span_equal_the_trainers_token_masks(bound, truncated) -> None:
    cfg = LossConfig(max_token_staleness=bound, truncated=truncated)
    rng = random.Random(f"{bound}{truncated}")
    for i in range(200):
        rollout, step = _random_rollout(rng, i), rng.randint(0, 8)
        fast, reference = MaskStats(), MaskStats()
        count_masked(rollout, step=step, cfg=cfg, stats=fast)
        token_masks(rollout, step=step, cfg=cfg, stats=reference)
        assert fast == reference


def test_token_staleness_and_masks_come_from_the_real_controller_and_loss() -> None:
    # One group per step on two slots (capacity 2), 10 s latency at 1 token/s,
    # 5 s training + 1 s sync: step v ends at 16 + 6v, when version v + 1 lands.
    # In steady state the group trained at step v is dispatched when step v - 2
    # takes its group (t = 6v - 2) and samples its tokens at 6v - 1 ... 6v + 8;
    # version v - 1 lands at 6v + 4, so 6 tokens per completion are 2 versions
    # old when trained and 4 are 1 version old. loss.max_token_staleness=1
    # masks the 6: 60% of the tokens.
    cfg = sim_config(policy="windowed", window=2, n=1, steps=12, slots=2, latency=10.0,
                     train_step_s=5.0, weight_sync_s=1.0, capacity=2, inflight=2, min_chunk=1)
    cfg = cfg.model_copy(update={
        "async_rl": cfg.async_rl.model_copy(update={"sampler": cfg.async_rl.sampler.model_copy(
            update={"staleness_of": "end_weight"})}),
        "simulate": cfg.simulate.model_copy(update={"tokens_per_s": 1.0}),
        "loss": LossConfig(max_token_staleness=1)})
    result = simulate(cfg)
    assert result.ledger["balanced"] and result.waste_frac == 0.0
    ends = [r["wall_time_s"] for r in result.records]
    assert ends == [16.0 + 6 * v for v in range(12)]
    for record in result.records[2:]:
        assert record["token_staleness_hist"] == {"1": 8, "2": 12}  # 2 completions
        assert record["train/masked_token_frac"] == pytest.approx(0.6)
    assert result.token_staleness_hist == {"0": 20, "1": 100, "2": 120}
    assert result.masked_token_frac == pytest.approx(120 / 240)
    assert result.trainer.mask_stats.tokens == 240


def test_long_tail_windowed_by_end_weight_keeps_efficiency_and_wastes_nothing() -> None:
    """Issue 21's acceptance workload (examples/sim/partial_rollouts.yaml):
    lognormal latencies (median 30 s, sigma 1), 64 groups per step, 256 slots,
    20 s of streamed training and 2 s of sync per step, capacity and in-flight
    bound 192. windowed s = 2 by start_weight throws a third of the groups away;
    by end_weight it keeps efficiency >= 0.95 and wastes <= 1%."""
    path = ROOT / "examples" / "sim" / "partial_rollouts.yaml"
    cfg = load_config(path)
    end = simulate(cfg, steps=120)
    start = simulate(cfg, steps=120, sampler_override={
        **cfg.async_rl.sampler.model_dump(), "staleness_of": "start_weight"})
    assert end.efficiency >= 0.95 and end.waste_frac <= 0.01
    assert start.waste_frac >= 0.30
    # The price is in the tokens: a straggler's early tokens are old by nature,
    # and max_token_staleness: 4 leaves them out of the loss.
    assert end.token_staleness_p95 > 2 >= start.token_staleness_p95
    assert 0.1 < end.masked_token_frac < 0.5 and start.masked_token_frac == 0.0


def test_a_shared_fleet_slows_every_decoding_group_as_more_decode() -> None:
    # 1 s per token alone, +1 s per other group decoding. a: 4 tokens from t = 0;
    # b: 2 tokens from t = 1. Until 1: a alone (1 token). Then 2 s per token for
    # both: b has its 2 at t = 5, a its 3rd. Then a alone again: its 4th at t = 6.
    decoder = SharedDecoder(lambda n: 1.0 + (n - 1))

    async def main() -> dict[str, float]:
        loop = asyncio.get_running_loop()
        done: dict[str, float] = {}

        async def group(name: str, tokens: int, at: float) -> None:
            await advance(at)
            fut = loop.create_future()
            decoder.join(loop, fut, tokens)
            await fut
            done[name] = loop.time()

        await asyncio.gather(group("a", 4, 0.0), group("b", 2, 1.0))
        return done

    assert run_virtual(main(), loop="jump") == {"b": 5.0, "a": 6.0}


def test_on_a_shared_fleet_tokens_carry_the_version_of_their_decode_step() -> None:
    # tokens latency: 1 s per token alone; 2 groups of 4 tokens decode together
    # (2 s per token) from t = 0; version 1 lands at t = 5 (sync 5 s, no pause):
    # each has sampled 2 tokens by then (at 2 and 4), the other 2 come after.
    model = Tokens(((4, 4.0),), base_s=0.0, per_token_s=1.0, per_token_per_group_s=1.0)
    engine = SimEngine(model, rollout_slots=2, weight_sync_s=5.0)

    async def main() -> list[GroupResult]:
        gens = [asyncio.ensure_future(engine.generate(request(i, n=1))) for i in range(2)]
        await engine.update_weights(None, 1)
        return list(await asyncio.gather(*gens))

    results = run_virtual(main(), loop="jump")
    assert [r.completions[0].versions for r in results] == [((0, 2), (1, 2))] * 2


@pytest.mark.parametrize(("length", "base_s", "token_s", "updates", "spans"), [
    (0, 0.0, 1.0, [(1.0, 4)], ()),  # no tokens, no spans
    (5, 0.0, 0.0, [(1.0, 4), (2.0, 5)], ((3, 5),)),  # all sampled at once, at the start
    (5, 0.0, 1.0, [(-1.0, 4), (2.0, 5)], ((4, 2), (5, 3))),  # an update before the start
    # token j is sampled at (j + 1) s: the one sampled at the very instant of an
    # update keeps the old version; updates after the last token add nothing
    (5, 0.0, 1.0, [(1.0, 4), (2.0, 5), (5.0, 6), (9.0, 7)], ((3, 1), (4, 1), (5, 3))),
    (5, 0.0, 1.0, [(0.5, 4), (0.9, 5), (7.0, 6)], ((5, 5),)),  # two before the first token
    (5, 0.5, 1.0, [(11.5, 4), (11.5, 5), (14.5, 6)], ((3, 1), (5, 3), (6, 1))),  # same instant
])
def test_version_spans_at_the_edges(length, base_s, token_s, updates, spans) -> None:
    work = Work(0.0, base_s, token_s, length, float(length))
    assert version_spans(length, work, 10.0 if base_s else 0.0, 3, updates) == spans


def test_a_chunks_tokens_by_version_and_a_groups_newest_version_are_version_spans() -> None:
    # Cohort mode counts a trained chunk's tokens per version at once and reads
    # each group's newest version alone; both must say what version_spans says,
    # including tokens sampled at the very instant of an update, groups that
    # start or end between updates, and token_s = 0.
    rng = random.Random(3)
    for _ in range(300):
        times = sorted(rng.uniform(0, 50) for _ in range(rng.randrange(0, 10)))
        updates = [(at, j + 1) for j, at in enumerate(times)]
        groups = []
        for _ in range(rng.randrange(1, 20)):
            since = rng.randrange(0, len(times) + 1)
            until = rng.randrange(since, len(times) + 1)
            length = rng.choice([1, 2, 5, 40, 1000])
            token_s = rng.choice([0.0, 0.01, 0.1, 1.0, 1 / 3, rng.random()])
            base_s = rng.choice([0.0, 0.3])
            start = (times[since - 1] if since else 0.0) + rng.random()
            if until > since and token_s and rng.random() < 0.3:  # a token on an update
                start = times[until - 1] - base_s - rng.randrange(0, length + 1) * token_s
            if since < len(times):
                start = min(start, times[since])
            groups.append((length, Work(0.0, base_s, token_s, length, float(length)), start,
                           since, until))
        expect: collections.Counter[int] = collections.Counter()
        for length, work, start, since, until in groups:
            spans = version_spans(length, work, start, since, updates[since:until])
            expect.update(dict(spans))
            assert last_version(length, work, start, since, updates[:until], since) == \
                spans[-1][0]
        got = tokens_by_version([SimpleNamespace(work=work, t0=start, since=since, until=until)
                                 for _, work, start, since, until in groups], times)
        assert got == {version: n for version, n in expect.items() if n}
