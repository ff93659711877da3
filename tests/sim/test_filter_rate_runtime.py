"""``simulate.filter_rate`` with the controller's dynamic-sampling filter
(issue 32): the simulated engine makes a fraction ``f`` of its groups flat (all
rewards equal), the real controller filters them at commit and replaces them.

These tests need the filter in the controller (the ``filtered`` ledger state,
the replacement and ``batch_multiplier`` in the samplers): they check that the
simulator's predictions stay honest with it on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.sim.calibrate import calibrate, steps_per_s
from asyncrl.sim.runner import fit_capacity, simulate

from .helpers import periods, sim_config
from .test_calibrate import run_config, write_run

L = 10.0
ZERO_VARIANCE = {"filter": "zero_variance"}


def generation_bound(f: float, **extra):
    """4 slots for 8 groups a step of 10 s each, a trainer of 1 s, lookahead 4:
    the fleet never idles (efficiency 1.00 without a filter)."""
    return sim_config(policy="in_order", window=4, n=8, slots=4, latency=L, train_step_s=1.0,
                      weight_sync_s=0.0, steps=100, capacity=40, inflight=40, min_chunk=1,
                      filter_rate=f, dynamic_sampling=ZERO_VARIANCE, **extra)


@pytest.mark.parametrize("f", [0.25, 0.5, 0.75])
def test_trained_groups_per_second_are_one_minus_f_of_the_generated(f: float) -> None:
    result = simulate(generation_bound(f))
    ledger = result.ledger
    trained = result.trainer.groups
    assert trained == ledger["trained"] == 100 * 8 and ledger["balanced"]
    # The filtered groups are exactly the flat ones the fleet finished (a group is
    # committed at the instant its generation ends; those in flight at the end
    # are pending, not finished).
    assert ledger["filtered"] == result.engine.flat_groups
    generated = trained + ledger["filtered"] + ledger["evicted"]  # finished generations
    # Closed form: trained/s = (1 - f) x generated/s. The flat groups are a
    # binomial draw from the prompt stream: 0.04 is over 2.5 standard deviations
    # at 800 trained groups (the run is seeded: the numbers do not vary).
    seconds = result.virtual_time_s
    assert (trained / seconds) / (generated / seconds) == pytest.approx(1 - f, abs=0.04)
    # The fleet never idles, and the bound (n L / ((1 - f) slots) per step) knows
    # that each trained group cost 1 / (1 - f) generations.
    assert result.generator_util > 0.95
    assert result.efficiency == pytest.approx(1.0, abs=0.1)


def test_over_sampling_spares_the_step_a_wait_for_replacements() -> None:
    """Synchronous in_order with a third of the groups flat: without over-sampling
    a step that filters waits a whole latency for each round of replacements;
    batch_multiplier 2 admits enough groups up front for most steps."""
    def run(multiplier: float):
        return simulate(sim_config(policy="in_order", window=0, n=8, slots=64, latency=L,
                                   train_step_s=1.0, weight_sync_s=0.0, steps=40, capacity=64,
                                   inflight=64, filter_rate=1 / 3,
                                   dynamic_sampling={**ZERO_VARIANCE,
                                                     "batch_multiplier": multiplier}))

    plain, over = run(1.0), run(2.0)
    assert plain.trainer.groups == over.trainer.groups == 40 * 8
    mean = [sum(periods(r)) / len(periods(r)) for r in (plain, over)]
    # P(a step of 16 admitted groups has fewer than 8 with signal) is about 3%.
    assert mean[1] < 0.8 * mean[0]
    assert mean[1] == pytest.approx(L + 1.0, rel=0.15)


def test_calibration_fits_the_filter_rate_and_predicts_the_run(tmp_path: Path) -> None:
    cfg = run_config({"name": "in_order", "max_lookahead_versions": 1}, capacity=16)
    cfg = cfg.model_copy(update={"grpo": cfg.grpo.model_copy(update={
        "dynamic_sampling": cfg.grpo.dynamic_sampling.model_copy(
            update={"filter": "zero_variance"})})})
    write_run(cfg, tmp_path / "a", filter_rate=0.4)
    cal = calibrate(tmp_path / "a")
    fit = cal.config.simulate
    assert fit is not None
    assert fit.filter_rate == pytest.approx(0.4, abs=0.08)
    assert cal.config.grpo.dynamic_sampling.filter == "zero_variance"
    predicted = simulate(load_config(tmp_path / "a" / "config.yaml").model_copy(
        update={"simulate": fit}))
    measured = [json.loads(x) for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert steps_per_s(predicted.records) == pytest.approx(steps_per_s(measured), rel=0.15)


def test_a_comparison_fits_the_capacity_of_over_sampled_batches() -> None:
    # --compare raises a policy's capacity to what it needs: with 1.5x over-sampling
    # in_order (lookahead 1) needs 2 batches of ceil(1.5 x 8) = 12 groups, not 16.
    cfg = sim_config(policy="in_order", window=1, n=8, slots=4, latency=L, train_step_s=1.0,
                     steps=5, capacity=8, inflight=8, min_chunk=1, filter_rate=0.5,
                     dynamic_sampling={**ZERO_VARIANCE, "batch_multiplier": 1.5})
    raised, note = fit_capacity(cfg, {"name": "in_order", "max_lookahead_versions": 1})
    assert raised.async_rl.max_buffered_rollouts == 24 and "8->24" in note
    assert simulate(raised, steps=5).ledger["balanced"]
