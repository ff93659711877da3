"""Every built-in sampler with ``grpo.dynamic_sampling`` on (issue 32): it owns
over-sampling (``batch_multiplier``) in its derived facts, and a run with the
filter and the multiplier on trains only informative groups, a full step each
time, with every group accounted for."""

from __future__ import annotations

import math

import pytest

from asyncrl.buffer import RolloutBuffer
from asyncrl.sampling import OverSamplingSampler, create_sampler
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, FlatTask, lognormal_latency

from .helpers import END_WEIGHT_VARIANTS, VARIANTS, make_twins, variant_id
from .reference import ReferenceModel

ALL = [*VARIANTS, *END_WEIGHT_VARIANTS]
variants = pytest.mark.parametrize("variant", ALL, ids=[variant_id(v) for v in ALL])


@variants
@pytest.mark.parametrize("multiplier", [1.0, 1.1, 1.5, 2.0])
def test_required_capacity_holds_whole_over_sampled_batches(variant: tuple,
                                                            multiplier: float) -> None:
    _, sampler, ref = make_twins(variant, capacity=4)
    assert isinstance(sampler, OverSamplingSampler)
    facts = (sampler.is_on_policy, sampler.max_staleness(), sampler.max_end_staleness())
    sampler.set_batch_multiplier(multiplier)
    # Written out: ceil(m * n) groups a batch, s + 1 batches ahead (1.1 * 10 is 11, not 12).
    per_batch = {1.0: 10, 1.1: 11, 1.5: 15, 2.0: 20}[multiplier]
    assert sampler.groups_per_batch(10) == per_batch
    window = variant[1]
    expected = None if ref.policy == "windowed" else per_batch * (window + 1)
    assert sampler.required_buffer_capacity(10) == expected
    assert sampler.required_capacity_for(window + 1, 10) == (
        None if expected is None else per_batch * (window + 2))
    # Over-sampling changes how much is generated, not the staleness contract.
    assert (sampler.is_on_policy, sampler.max_staleness(), sampler.max_end_staleness()) == facts
    assert sampler.surplus


@pytest.mark.parametrize("bad", [0.5, 0, math.nan, math.inf, True, "2"])
def test_a_bad_multiplier_is_refused(bad: object) -> None:
    sampler = create_sampler(RolloutBuffer(4), {"name": "in_order"})
    with pytest.raises(ValueError, match="batch_multiplier must be a number >= 1"):
        sampler.set_batch_multiplier(bad)  # type: ignore[arg-type]


def _sampler_config(variant: tuple) -> dict:
    policy, window, fresh, *measure = variant
    return ReferenceModel(policy, window, capacity=1, freshest_first=fresh,
                          staleness_of=measure[0] if measure else "start_weight").config()


@variants
@pytest.mark.parametrize("rate", [0.3, 0.9])
def test_every_sampler_trains_full_informative_steps_with_the_filter_on(variant: tuple,
                                                                        rate: float) -> None:
    per_step, multiplier = 4, 1.5
    k = math.ceil(per_step * multiplier)
    capacity = max(12, k * (variant[1] + 1))
    trainer = FakeTrainer()
    ctl = make_controller(_sampler_config(variant), engines=[FakeEngine(lognormal_latency(7))],
                          trainer=trainer, task=FlatTask(rate), steps=8, per_step=per_step,
                          capacity=capacity, inflight=10,
                          dynamic_sampling={"filter": "zero_variance",
                                            "batch_multiplier": multiplier,
                                            "max_gen_batches": 30})
    result = run_virtual(ctl.run())
    assert result.steps == 8
    by_step: dict[int, list] = {}
    for step, rollouts in trainer.chunks:
        by_step.setdefault(step, []).extend(rollouts)
    for step in range(8):
        assert len(by_step[step]) == per_step, step
        assert all(max(r.rewards) > min(r.rewards) for r in by_step[step]), step
    ledger = result.summary["ledger"]
    assert ledger["balanced"], ledger
    assert ledger["filtered"] > 0
    assert ledger["dispatched"] == sum(ledger[s] for s in (
        "trained", "evicted", "aborted", "failed", "filtered", "pending"))
    assert result.summary["dynamic_sampling"]["groups_per_batch"] == k
    if variant[0] == "ready_first":
        assert ledger["evicted"] == 0  # its surplus is kept for later steps, never evicted
    if variant[0] == "in_order" and rate == 0.3:
        # Its surplus is stamped for a step that has gone: evicted, and counted.
        assert ledger["evicted"] > 0
        assert sum(r["groups_evicted"] for r in ctl.step_records) == ledger["evicted"]
