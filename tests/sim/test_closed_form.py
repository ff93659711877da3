"""Closed forms with constant latencies (docs/simulate.md derives each of them).

With ``L`` the latency, ``T' = train_step_s + weight_sync_s`` the trainer's
time per step, ``n`` groups per step and the sync inside the train pump (the
version advances only after it), in_order with lookahead ``s`` settles into a
period ``P = max(T', (L + T') / (s + 1), n * L / slots)`` per step, averaged
over ``s + 1`` steps when the fleet holds every outstanding batch.
"""

from __future__ import annotations

import math

import pytest

from asyncrl.sim.runner import physical_bound, simulate

from .helpers import periods, sim_config

L, T, S = 10.0, 3.0, 1.0


def test_sync_step_is_latency_plus_train_plus_sync_exactly() -> None:
    cfg = sim_config(window=0, n=8, slots=8, latency=L, train_step_s=T, weight_sync_s=S)
    result = simulate(cfg, steps=25)
    assert periods(result) == pytest.approx([L + T + S] * 25, abs=1e-9)
    assert result.virtual_time_s == pytest.approx(25 * (L + T + S), abs=1e-9)
    assert result.staleness_max == 0
    assert result.trainer_idle_frac == pytest.approx(L / (L + T + S))


def test_sync_with_fewer_slots_than_groups_runs_in_waves() -> None:
    cfg = sim_config(window=0, n=8, slots=3, latency=L, train_step_s=T, weight_sync_s=S)
    result = simulate(cfg, steps=10)
    assert periods(result) == pytest.approx([3 * L + T + S] * 10, abs=1e-9)


@pytest.mark.parametrize(("latency", "train"), [(10.0, 3.0), (2.0, 5.0), (4.0, 3.0)])
def test_lookahead_one_is_a_two_stage_pipeline(latency: float, train: float) -> None:
    """Slots = n: the fleet holds one batch, so generation of batch d+1 and
    training of step d overlap and a step takes max(L, T') after warm-up."""
    cfg = sim_config(window=1, n=8, slots=8, latency=latency, train_step_s=train,
                     weight_sync_s=S)
    result = simulate(cfg, steps=30)
    expected = max(latency, train + S)
    assert periods(result)[3:] == pytest.approx([expected] * 27, abs=1e-9)
    assert result.staleness_max <= 1


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("room", ["one_batch", "all_batches"])
def test_in_order_period_matches_the_derivation(window: int, room: str) -> None:
    n = 8
    slots = n if room == "one_batch" else n * (window + 1)
    cfg = sim_config(window=window, n=n, slots=slots, latency=L, train_step_s=T, weight_sync_s=S)
    steps = 12 * (window + 1)
    result = simulate(cfg, steps=steps)
    tail = periods(result)[2 * (window + 1):]
    tail = tail[: len(tail) // (window + 1) * (window + 1)]
    expected = max(T + S, (L + T + S) / (window + 1), n * L / slots)
    assert sum(tail) / len(tail) == pytest.approx(expected, abs=1e-9)
    # Averaged over a cycle of window + 1 steps, every cycle is the same.
    cycles = [sum(tail[i:i + window + 1]) for i in range(0, len(tail), window + 1)]
    assert cycles == pytest.approx([cycles[0]] * len(cycles), abs=1e-9)


@pytest.mark.parametrize("policy", ["in_order", "weight_fifo", "windowed", "ready_first"])
@pytest.mark.parametrize("window", [1, 2])
def test_training_bound_keeps_the_trainer_busy(policy: str, window: int) -> None:
    latency = {"distribution": "lognormal", "median": 4.0, "sigma": 0.3}
    cfg = sim_config(policy=policy, window=window, n=8, slots=8, latency=latency,
                     train_step_s=12.0, weight_sync_s=1.0, train_per_group_s=0.1, min_chunk=2)
    result = simulate(cfg, steps=40)
    after = result.records[3:]
    idle = sum(r["trainer_idle_s"] for r in after)
    busy_frac = 1 - idle / sum(r["step_time_s"] for r in after)
    assert busy_frac >= 0.99
    bound = physical_bound(cfg)
    assert bound.limited_by == "trainer"
    assert bound.trainer_step_s == pytest.approx(12.0 + 1.0 + 0.1 * 8)
    assert sum(r["step_time_s"] for r in after) / len(after) == pytest.approx(
        bound.step_s, rel=0.01)


def test_efficiency_is_bound_over_achieved_step_time() -> None:
    cfg = sim_config(window=0, n=8, slots=8, latency=L, train_step_s=T, weight_sync_s=S)
    result = simulate(cfg, steps=10)
    bound = physical_bound(cfg)
    assert bound.step_s == max(T + S, 8 * L / 8)
    assert result.efficiency == pytest.approx(bound.step_s / (L + T + S))
    assert result.steps_per_hour == pytest.approx(3600 / (L + T + S))


def test_generation_bound_uses_mean_latency_and_failures() -> None:
    latency = {"distribution": "lognormal", "median": 20.0, "sigma": 1.0}
    cfg = sim_config(n=64, slots=16, latency=latency, failure_rate=0.2)
    bound = physical_bound(cfg)
    mean = 20.0 * math.exp(0.5)
    assert bound.generation_step_s == pytest.approx(64 * mean / 0.8 / 16)
    assert bound.limited_by == "generation"
