"""Every built-in sampler through the real controller, under virtual time."""

from __future__ import annotations

import collections

import pytest

from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, lognormal_latency

SAMPLERS = [
    {"name": "in_order", "max_lookahead_versions": 0},
    {"name": "in_order", "max_lookahead_versions": 1},
    {"name": "in_order", "max_lookahead_versions": 3},
    {"name": "weight_fifo", "max_staleness_versions": 0},
    {"name": "weight_fifo", "max_staleness_versions": 1},
    {"name": "weight_fifo", "max_staleness_versions": 2},
    {"name": "windowed", "max_staleness_versions": 0},
    {"name": "windowed", "max_staleness_versions": 1},
    {"name": "windowed", "max_staleness_versions": 2, "sample_freshest_first": True},
    {"name": "ready_first", "max_staleness_versions": 0},
    {"name": "ready_first", "max_staleness_versions": 2},
]


def _window(sampler: dict) -> int:
    return sampler.get("max_lookahead_versions", sampler.get("max_staleness_versions"))


def _id(sampler: dict) -> str:
    extra = "-fresh" if sampler.get("sample_freshest_first") else ""
    return f"{sampler['name']}-{_window(sampler)}{extra}"


@pytest.mark.parametrize("sampler", SAMPLERS, ids=_id)
@pytest.mark.parametrize("seed", [0, 1])
def test_policy_contract_under_long_tails(sampler: dict, seed: int) -> None:
    s = _window(sampler)
    per_step, capacity, inflight = 4, 4 * (s + 1) + 2, 6
    engine = FakeEngine(lognormal_latency(seed, median=1.0, sigma=1.0))
    ctl = make_controller(sampler, engines=[engine], trainer=FakeTrainer(step_time=0.7),
                          steps=50, per_step=per_step, capacity=capacity, inflight=inflight)
    result = run_virtual(ctl.run())

    assert result.steps == 50 and result.stop_reason == "max_num_steps"
    ledger = result.summary["ledger"]
    assert ledger["balanced"], ledger
    assert ledger["dispatched"] == sum(ledger[k] for k in
                                       ("trained", "evicted", "aborted", "failed", "pending"))
    assert ledger["trained"] == 50 * per_step

    trained = [r for r in ctl.ledger.records() if r.state == "trained"]
    staleness = [r.staleness for r in trained]
    assert min(staleness) >= 0
    bound = ctl.sampler.max_staleness()
    if bound is not None:
        assert max(staleness) <= bound
    if ctl.sampler.is_on_policy:
        assert set(staleness) == {0}

    if sampler["name"] == "in_order":
        # Each step trains exactly the batch stamped for it.
        by_step = collections.defaultdict(list)
        for r in trained:
            by_step[r.end_step].append(r.target_step)
        assert all(set(stamps) == {step} for step, stamps in by_step.items())
        assert all(len(stamps) == per_step for stamps in by_step.values())
    if sampler["name"] in ("windowed", "weight_fifo"):
        assert all(r.end_step - r.start_weight <= s for r in trained)

    assert result.summary["max_buffer_seen"] <= capacity
    assert result.summary["max_inflight_seen"] <= inflight
    assert engine.max_active <= inflight
    # Weight sync: the engine saw every version, in order.
    assert engine.versions_seen == list(range(1, 51))


@pytest.mark.parametrize("sampler", SAMPLERS[:3], ids=_id)
def test_in_order_batches_are_generated_with_weights_at_least_their_stamp_minus_window(
    sampler: dict,
) -> None:
    ctl = make_controller(sampler, engines=[FakeEngine(lognormal_latency(3))], steps=20,
                          capacity=4 * (_window(sampler) + 1))
    run_virtual(ctl.run())
    for rec in ctl.ledger.records():
        assert rec.start_weight >= rec.target_step - _window(sampler)


def test_weight_fifo_trains_weight_versions_in_order() -> None:
    ctl = make_controller({"name": "weight_fifo", "max_staleness_versions": 2},
                          engines=[FakeEngine(lognormal_latency(5, sigma=1.2))], steps=40,
                          capacity=14, min_chunk=1)
    run_virtual(ctl.run())
    trained = sorted((r for r in ctl.ledger.records() if r.state == "trained"),
                     key=lambda r: (r.end_step, r.finish_time))
    # Within one step, chunks come from non-decreasing start weights.
    by_step = collections.defaultdict(list)
    for r in trained:
        by_step[r.end_step].append(r.start_weight)
    for weights in by_step.values():
        assert max(weights) - min(weights) <= 2


def test_multiple_engines_share_the_load_and_all_see_every_version() -> None:
    engines = [FakeEngine(lognormal_latency(i)) for i in range(3)]
    ctl = make_controller({"name": "ready_first", "max_staleness_versions": 1},
                          engines=engines, steps=25, capacity=8, inflight=6)
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"]
    assert all(e.versions_seen == list(range(1, 26)) for e in engines)
    assert all(e.generated > 10 for e in engines)
