"""simulate() and compare(): ledger, staleness bounds, metrics, determinism, comparisons."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config import config_from_dict
from asyncrl.errors import ConfigError, SetupError
from asyncrl.sim.clock import JumpClockLoop, run_virtual
from asyncrl.sim.reference import serial_reference_s
from asyncrl.sim.runner import ROW_KEYS, compare, physical_bound, simulate
from tests.vtime import advance

from .helpers import sim_config

POLICIES = ("in_order", "weight_fifo", "windowed", "ready_first")
LOGNORMAL = {"distribution": "lognormal", "median": 5.0, "sigma": 1.0}
BIMODAL = {"distribution": "bimodal", "fast": {"median": 2.0, "sigma": 0.3},
           "slow": {"median": 30.0, "sigma": 0.3}, "slow_fraction": 0.15}


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(("latency", "failure_rate", "inflight"), [
    (LOGNORMAL, 0.0, None),
    (BIMODAL, 0.1, 6),
    (BIMODAL, 0.0, 40),
])
@pytest.mark.parametrize("window", [0, 1, 3])
def test_ledger_balances_and_staleness_stays_in_the_window(
    policy: str, latency: dict, failure_rate: float, inflight: int | None, window: int
) -> None:
    cfg = sim_config(
        policy=policy, window=window, n=6, slots=5, latency=latency, train_step_s=4.0,
        failure_rate=failure_rate, inflight=inflight, min_chunk=2, seed=window,
        rollout_failure={"max_infra_attempts_per_prompt": 4, "backoff_base_s": 0.5,
                         "max_consecutive_dropped_prompts": 1000, "on_dropped_prompt": "replace",
                         "max_replacement_attempts": 1000},
    )
    result = simulate(cfg, steps=20)
    ledger = result.ledger
    assert ledger["balanced"], ledger
    assert ledger["dispatched"] == sum(
        ledger[k] for k in ("trained", "evicted", "aborted", "failed", "pending"))
    assert ledger["trained"] == 20 * 6
    assert result.steps == 20 and result.stop_reason == "max_num_steps"
    if policy != "ready_first" or window == 0:
        assert result.staleness_max <= window
    assert 0 <= result.staleness_p95 <= result.staleness_max
    assert result.waste_frac == pytest.approx(
        (ledger["evicted"] + ledger["aborted"]) / ledger["dispatched"])
    assert 0 < result.generator_util <= 1 + 1e-9
    assert 0 <= result.trainer_idle_frac < 1
    assert result.engine is not None and result.engine.max_busy <= 5
    if failure_rate:
        assert result.engine.failures > 0


def test_row_has_exactly_the_documented_keys() -> None:
    result = simulate(sim_config(), steps=3)
    assert tuple(result.row()) == ROW_KEYS
    assert result.row()["sampler"] == "in_order"


def test_generator_util_counts_busy_slot_seconds() -> None:
    cfg = sim_config(window=0, n=4, slots=8, latency=10.0, train_step_s=3.0, weight_sync_s=1.0)
    result = simulate(cfg, steps=5)
    # 4 of 8 slots busy for 10 s of every 14 s step.
    assert result.generator_util == pytest.approx(4 * 10 / (8 * 14))


def test_same_seed_same_result_other_seed_other_result() -> None:
    cfg = sim_config(policy="windowed", window=1, latency=LOGNORMAL, slots=6, seed=3)
    a, b = simulate(cfg, steps=15), simulate(cfg, steps=15)
    assert a.row() == b.row()
    assert a.ledger == b.ledger
    other = simulate(cfg.model_copy(update={"seed": 4}), steps=15)
    assert other.row() != a.row()


def test_sync_matches_the_serial_reference_from_the_drawn_latencies() -> None:
    for slots, per_group, min_chunk in [(8, 0.0, 8), (3, 0.0, 8), (8, 0.4, 2), (5, 0.3, 3)]:
        cfg = sim_config(window=0, n=8, slots=slots, latency=LOGNORMAL, train_step_s=2.0,
                         train_per_group_s=per_group, min_chunk=min_chunk)
        result = simulate(cfg, steps=15)
        assert result.virtual_time_s == pytest.approx(serial_reference_s(result, cfg), rel=1e-12)


def test_deterministic_mode_is_passed_through() -> None:
    cfg = sim_config(policy="ready_first", window=1, latency=LOGNORMAL, deterministic=True)
    result = simulate(cfg, steps=10)
    assert result.ledger["balanced"]


def test_setup_validation_still_applies_to_a_single_run() -> None:
    cfg = sim_config(window=2, n=8, capacity=8)
    with pytest.raises(SetupError, match="max_buffered_rollouts"):
        simulate(cfg, steps=2)


def test_no_simulate_block_says_how_to_add_one() -> None:
    cfg = config_from_dict({"grpo": {"num_prompts_per_step": 4}})
    with pytest.raises(ConfigError, match="simulate:"):
        simulate(cfg)
    with pytest.raises(ConfigError, match="simulate"):
        physical_bound(cfg)


def test_compare_runs_each_policy_with_the_config_window() -> None:
    cfg = sim_config(policy="weight_fifo", window=2, n=6, slots=6, latency=LOGNORMAL)
    results = compare(cfg, POLICIES, steps=8)
    assert [r.sampler for r in results] == list(POLICIES)
    assert [r.window for r in results] == [2, 2, 2, 2]
    assert all(r.ledger["balanced"] for r in results)
    # Same prompts, same latencies: all four runs saw the same first 6 latencies.
    first = [tuple(r.engine.first_attempt_latency(i) for i in range(6)) for r in results]
    assert len(set(first)) == 1


def test_compare_raises_a_short_capacity_and_says_so() -> None:
    # windowed needs no particular capacity; the gated policies need n * (s + 1).
    cfg = sim_config(policy="windowed", window=1, n=6, capacity=6, inflight=6)
    results = compare(cfg, ["windowed", "in_order"], steps=5)
    assert results[0].note == ""
    assert "max_buffered_rollouts raised 6->12" in results[1].note
    assert results[1].ledger["balanced"]


def test_compare_with_a_custom_sampler_uses_window_one() -> None:
    cfg = config_from_dict({
        "grpo": {"num_prompts_per_step": 4},
        "async_rl": {
            "sampler": {"name": "custom", "target": "asyncrl.sampling.policies:WindowedSampler",
                        "max_staleness_versions": 3},
            "max_buffered_rollouts": 8, "max_inflight_prompts": 8,
            "min_groups_for_streaming_train": 4,
        },
        "simulate": {"rollout_slots": 4, "generation_latency_s": LOGNORMAL,
                     "train_step_s": 2.0, "weight_sync_s": 0.5},
    })
    own = simulate(cfg, steps=5)
    # Its window is its own (the sampler's window attribute), and the row says so.
    assert own.sampler == "asyncrl.sampling.policies:WindowedSampler" and own.window == 3
    assert "window: the custom sampler's own" in own.note
    results = compare(cfg, ["in_order", "windowed"], steps=5)
    assert [r.window for r in results] == [1, 1]
    assert all("window 1" in r.note for r in results)


def test_compare_rejects_unknown_policies() -> None:
    with pytest.raises(ConfigError, match="unknown policy 'fifo'"):
        compare(sim_config(), ["fifo"], steps=2)


def test_aborts_in_windowed_count_as_waste_and_free_slots() -> None:
    cfg = sim_config(policy="windowed", window=1, n=6, slots=6, latency=BIMODAL, capacity=24,
                     inflight=24, min_chunk=2, train_step_s=1.0, weight_sync_s=0.2)
    result = simulate(cfg, steps=30)
    assert result.ledger["aborted"] > 0
    # Each abort the engine saw in a slot is an aborted group in the ledger; the
    # rest were still queued for a slot and cost no generation time.
    assert 0 < result.engine.aborts <= result.ledger["aborted"]
    assert result.waste_frac > 0


def test_jump_loop_agrees_with_looptime() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        seen: list[float] = []

        async def worker(delays: list[float]) -> None:
            for d in delays:
                await advance(d)
                seen.append(loop.time())

        await asyncio.gather(worker([0.5, 2.0, 3.25]), worker([1.0, 1.0, 10.0]),
                             asyncio.wait_for(worker([0.1] * 5), timeout=100))
        return seen

    jump = run_virtual(scenario(), loop="jump")
    reference = run_virtual(scenario(), loop="looptime")
    assert jump == pytest.approx(reference, abs=1e-6)


@pytest.mark.parametrize("policy", POLICIES)
def test_simulation_is_the_same_on_both_virtual_clocks(policy: str) -> None:
    cfg = sim_config(policy=policy, window=1, n=6, slots=4, latency=BIMODAL, inflight=8,
                     min_chunk=2)
    jump = simulate(cfg, steps=15)
    reference = simulate(cfg, steps=15, clock="looptime")
    assert jump.ledger == reference.ledger
    assert jump.staleness_hist == reference.staleness_hist
    # looptime puts timers on a microsecond grid; the jump loop uses exact times.
    assert jump.virtual_time_s == pytest.approx(reference.virtual_time_s, abs=1e-4)


def test_jump_loop_settled_waits_until_every_task_is_blocked() -> None:
    async def scenario() -> tuple[list[str], float]:
        loop = asyncio.get_running_loop()
        seen: list[str] = []
        gate = asyncio.Event()

        async def chain(n: int) -> None:  # n hops through the ready queue
            for i in range(n):
                await asyncio.sleep(0)
                seen.append(f"hop{i}")
            await gate.wait()
            seen.append("opened")

        tasks = [asyncio.ensure_future(chain(20)), asyncio.ensure_future(advance(7))]
        await loop.settled()
        assert seen == [f"hop{i}" for i in range(20)] and loop.time() == 0.0
        gate.set()
        await loop.settled()
        assert seen[-1] == "opened" and loop.time() == 0.0  # the timer is still pending
        await asyncio.gather(*tasks)
        return seen, loop.time()

    seen, end = run_virtual(scenario(), loop="jump")
    assert seen[-1] == "opened" and end == 7.0


def test_jump_loop_gives_the_same_times_in_debug_mode() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        times = []
        for d in (0.25, 1.5, 0.0, 4.0):
            await advance(d)
            times.append(loop.time())
        return times

    results = []
    for debug in (False, True):
        loop = JumpClockLoop()
        loop.set_debug(debug)
        try:
            results.append(loop.run_until_complete(scenario()))
        finally:
            loop.close()
    assert results[0] == results[1] == [0.25, 1.75, 1.75, 5.75]


def test_jump_loop_turns_a_deadlock_into_an_error() -> None:
    async def stuck() -> None:
        await advance(3)
        await asyncio.get_running_loop().create_future()

    with pytest.raises(asyncio.TimeoutError, match="deadlock"):
        run_virtual(stuck(), loop="jump")


def test_simulate_restores_gc_and_logging_settings() -> None:
    import gc
    import logging

    before = gc.get_threshold()
    level = logging.getLogger("asyncrl.controller").level
    simulate(sim_config(failure_rate=0.2,
                        rollout_failure={"max_consecutive_dropped_prompts": 100,
                                         "on_dropped_prompt": "replace",
                                         "max_replacement_attempts": 100}), steps=3)
    assert gc.get_threshold() == before
    assert logging.getLogger("asyncrl.controller").level == level
