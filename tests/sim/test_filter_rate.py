"""``simulate.filter_rate``: the simulated groups that come back with all rewards
equal, which ``grpo.dynamic_sampling``'s filter drops at commit (issue 32).

The simulator only makes such groups; the real controller filters them. What
needs the controller's filter is in test_filter_rate_runtime.py."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config import config_from_dict
from asyncrl.errors import ConfigError
from asyncrl.sim.backends import SimEngine
from asyncrl.sim.calibrate import filter_rate
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import Constant, Lognormal
from asyncrl.sim.runner import physical_bound, simulate
from asyncrl.types import GenerationRequest, GroupResult, Prompt

from .helpers import sim_config


def request(i: int, attempt: int = 1, n: int = 4) -> GenerationRequest:
    return GenerationRequest(group_id=f"g{i}", prompt=Prompt(i, ""), num_generations=n,
                             attempt=attempt)


def generate_all(engine: SimEngine, ids: list[int]) -> list[GroupResult]:
    async def main() -> list[GroupResult]:
        return list(await asyncio.gather(*(engine.generate(request(i)) for i in ids)))
    return run_virtual(main(), loop="jump")


def is_flat(result: GroupResult) -> bool:
    rewards = result.rewards
    assert rewards is not None
    return max(rewards) == min(rewards)


@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_the_requested_fraction_of_groups_comes_back_flat(rate: float) -> None:
    engine = SimEngine(Constant(1.0), rollout_slots=4000, filter_rate=rate, seed=1)
    results = generate_all(engine, list(range(4000)))
    flat = sum(map(is_flat, results))
    # binomial(4000, rate): 5 standard deviations are under 0.04
    assert abs(flat / 4000 - rate) < 0.04
    assert flat == engine.flat_groups


def test_without_a_filter_rate_every_group_carries_signal() -> None:
    """So a zero_variance filter with filter_rate 0 trains every group."""
    engine = SimEngine(Constant(1.0), rollout_slots=100, seed=1)
    results = generate_all(engine, list(range(100)))
    assert not any(map(is_flat, results)) and engine.flat_groups == 0


def test_flat_groups_belong_to_the_prompt_and_leave_latencies_alone() -> None:
    model = Lognormal(10.0, 1.0)
    a = SimEngine(model, rollout_slots=8, seed=5, filter_rate=0.5, failure_rate=0.3)
    b = SimEngine(model, rollout_slots=8, seed=5, filter_rate=0.5, failure_rate=0.3)
    plain = SimEngine(model, rollout_slots=8, seed=5, failure_rate=0.3)
    forward = [a.is_flat(i) for i in range(60)]
    assert forward == [b.is_flat(i) for i in reversed(range(60))][::-1]
    assert 10 < sum(forward) < 50
    # every attempt of a prompt: a retry of a flat prompt is flat too
    assert [a.is_flat(i) for i in range(60)] == forward
    # common random numbers: the filter's stream shifts no latency or failure
    assert [a._draw(request(i)) for i in range(60)] == [plain._draw(request(i))
                                                         for i in range(60)]


def test_filter_rate_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="filter_rate must be in"):
        SimEngine(Constant(1.0), rollout_slots=1, filter_rate=1.0)
    with pytest.raises(ConfigError, match="filter_rate"):
        config_from_dict({"simulate": {"filter_rate": 1.0}})


def test_the_fleet_bound_counts_the_generation_filtered_groups_cost() -> None:
    on = sim_config(n=8, slots=4, latency=10.0, filter_rate=0.75,
                    dynamic_sampling={"filter": "zero_variance"})
    # 8 groups of 10 s on 4 slots, four generated per trained one
    assert physical_bound(on).generation_step_s == pytest.approx(8 * 10.0 / 4 / 0.25)
    # without a filter the flat groups are trained: no extra generation
    off = sim_config(n=8, slots=4, latency=10.0, filter_rate=0.75)
    assert physical_bound(off).generation_step_s == pytest.approx(8 * 10.0 / 4)


def test_cohort_mode_refuses_a_filter_rate() -> None:
    cfg = sim_config(n=8, filter_rate=0.5)
    cfg = cfg.model_copy(update={"simulate": cfg.simulate.model_copy(update={"mode": "cohort"})})
    with pytest.raises(ConfigError, match=r"simulate\.filter_rate=0\.5: set it to 0"):
        simulate(cfg, steps=2)


def test_calibration_fits_the_filtered_fraction_of_committed_groups() -> None:
    ledger = ([{"state": "trained"}] * 6 + [{"state": "filtered"}] * 3
              + [{"state": "evicted"}] + [{"state": "aborted"}] * 5 + [{"state": "failed"}])
    assert filter_rate(ledger) == pytest.approx(0.3)
    assert filter_rate([{"state": "trained"}] * 4 + [{"state": "aborted"}]) == 0.0
    assert filter_rate([]) == 0.0
    assert filter_rate([{"state": "filtered"}]) == 0.99
