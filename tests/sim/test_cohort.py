"""Cohort mode (simulate.mode: cohort) against the per-group mode (the real controller).

Both modes draw the first attempt of prompt k from the same seeded stream, so
on the same config they simulate the very same workload: the rows must agree
(the issue asks for efficiency, staleness and waste within 1%; with continuous
latencies they agree to float rounding, which is what is checked).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from asyncrl.config import RunConfig, load_config
from asyncrl.errors import ConfigError
from asyncrl.sim.backends import SimEngine
from asyncrl.sim.cohort import KEEP_RECORDS, Fleet
from asyncrl.sim.cohort_fleet import _Window
from asyncrl.sim.latency import Lognormal
from asyncrl.sim.reference import serial_reference_s
from asyncrl.sim.runner import BUILTIN_POLICIES, ROW_KEYS, policy_config, simulate

from .helpers import sim_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"
SMALL = ("balanced", "generation_bound", "long_tail", "training_bound", "partial_rollouts")
LOGNORMAL = {"distribution": "lognormal", "median": 5.0, "sigma": 1.0}


def cohort(cfg: RunConfig) -> RunConfig:
    assert cfg.simulate is not None
    return cfg.model_copy(update={"simulate": cfg.simulate.model_copy(update={"mode": "cohort"})})


def assert_same(per_group, in_cohort) -> None:
    for key in ROW_KEYS:
        a, b = per_group.row()[key], in_cohort.row()[key]
        if isinstance(a, float):
            assert b == pytest.approx(a, rel=1e-9, abs=1e-12), key
        else:
            assert a == b, key
    assert {k: v for k, v in per_group.ledger.items() if k != "balanced"} == \
        {k: v for k, v in in_cohort.ledger.items() if k != "balanced"}
    assert in_cohort.ledger["balanced"]
    assert in_cohort.staleness_hist == per_group.staleness_hist
    assert in_cohort.token_staleness_hist == per_group.token_staleness_hist
    assert [r["wall_time_s"] for r in in_cohort.records] == pytest.approx(
        [r["wall_time_s"] for r in per_group.records], rel=1e-12)


@pytest.mark.parametrize("name", SMALL)
def test_every_small_example_agrees_with_the_real_controller(name: str) -> None:
    path = EXAMPLES / f"{name}.yaml"
    cfg = load_config(path)
    per_group = simulate(cfg, steps=40, base_dir=path.parent, record_intervals=False)
    in_cohort = simulate(cohort(cfg), steps=40, base_dir=path.parent, record_intervals=False)
    assert_same(per_group, in_cohort)
    assert "cohort mode" in in_cohort.note and "cohort" not in per_group.note


@pytest.mark.parametrize("policy", BUILTIN_POLICIES)
def test_every_policy_agrees_on_the_long_tail(policy: str) -> None:
    path = EXAMPLES / "long_tail.yaml"
    cfg = load_config(path)
    sampler, _ = policy_config(cfg, policy)
    per_group = simulate(cfg, sampler_override=sampler, steps=40, record_intervals=False)
    in_cohort = simulate(cohort(cfg), sampler_override=sampler, steps=40,
                         record_intervals=False)
    assert_same(per_group, in_cohort)


@pytest.mark.parametrize(("policy", "measure"), [
    ("windowed", "end_weight"), ("weight_fifo", "end_weight"), ("windowed", "start_weight")])
@pytest.mark.parametrize("window", [0, 1, 3])
def test_tight_buffers_aborts_evictions_and_queued_slots_agree(
        policy: str, measure: str, window: int) -> None:
    # Fewer slots than groups (FIFO queueing), a buffer and an in-flight bound
    # that bind, heavy-tailed latencies: aborts, evictions and masked tokens.
    cfg = sim_config(policy=policy, window=window, n=6, slots=5, latency=LOGNORMAL,
                     train_step_s=4.0, train_per_group_s=0.2, inflight=9, min_chunk=2,
                     capacity=6 * (window + 1), seed=window)
    cfg = cfg.model_copy(update={
        "loss": cfg.loss.model_copy(update={"max_token_staleness": 1}),
        "async_rl": cfg.async_rl.model_copy(update={
            "sampler": cfg.async_rl.sampler.model_copy(update={"staleness_of": measure})})})
    per_group = simulate(cfg, steps=25, record_intervals=False)
    in_cohort = simulate(cohort(cfg), steps=25, record_intervals=False)
    assert_same(per_group, in_cohort)


def test_the_fleet_draws_what_the_per_group_engine_draws() -> None:
    model = Lognormal(30.0, 0.6)
    engine = SimEngine(model, rollout_slots=4, seed=3, tokens_per_s=20.0)
    fleet = Fleet(model, slots=4, seed=3, tokens_per_s=20.0)
    ids = [0, 1, 4095, 4096, 9000]
    assert [fleet.work(i).latency for i in ids] == [engine.first_attempt_latency(i) for i in ids]
    # The run forgot what it handed out; any prompt is drawn again from the seed.
    assert fleet.first_attempt_latency(1) == engine.first_attempt_latency(1)
    with pytest.raises(IndexError, match="handed out"):
        fleet.work(1)


def test_the_window_holds_one_batch_however_far_it_reads() -> None:
    drawn = []

    def draw(_rng: object, k: int) -> list[int]:
        start = len(drawn)
        drawn.extend(range(start, start + k))
        return list(range(start, start + k))

    window = _Window(None, draw)
    assert [window.at(i) for i in (0, 5, 4095, 4096, 12_000)] == [0, 5, 4095, 4096, 12_000]
    assert len(window._buf) <= 4096  # the memory bound is the point
    # A run of reads (a burst of groups starting together) across batches.
    assert window.run(12_001, 5000) == list(range(12_001, 17_001))
    assert window.run(20_000, 3) == [20_000, 20_001, 20_002]
    assert len(window._buf) <= 5000 + 4096  # the longest read and one batch
    with pytest.raises(IndexError, match="handed out"):
        window.run(12_000, 2)


@pytest.mark.parametrize("mode", ["per_group", "cohort"])
def test_records_past_the_window_are_kept_as_aggregates(mode: str) -> None:
    cfg = sim_config(n=2, slots=2, latency=1.0, train_step_s=1.0, weight_sync_s=0.0)
    cfg = cohort(cfg) if mode == "cohort" else cfg
    result = simulate(cfg, steps=KEEP_RECORDS + 5, record_intervals=False)
    assert result.steps == KEEP_RECORDS + 5
    assert len(result.records) == KEEP_RECORDS
    assert sum(result.staleness_hist.values()) == 2 * (KEEP_RECORDS + 5)
    assert result.ledger["trained"] == 2 * (KEEP_RECORDS + 5)


def test_the_serial_reference_reads_the_cohort_fleet() -> None:
    cfg = sim_config(window=0, n=6, slots=4, latency=LOGNORMAL, train_step_s=2.0)
    result = simulate(cohort(cfg), steps=10, record_intervals=False)
    assert serial_reference_s(result, cfg) == pytest.approx(result.virtual_time_s, rel=1e-12)


def test_the_timeline_keeps_a_sample_of_the_slots() -> None:
    cfg = sim_config(n=100, slots=200, latency=LOGNORMAL, capacity=200, inflight=200,
                     min_chunk=100)
    result = simulate(cohort(cfg), steps=3)
    gens = [i for i in result.timeline if i["kind"] == "gen"]
    assert gens and len(gens) < 3 * 100
    assert {i["kind"] for i in result.timeline} >= {"gen", "step", "sync"}
    assert result.timeline_until(2) is not None and math.isfinite(result.timeline_until(2))


@pytest.mark.parametrize(("override", "says"), [
    ({"simulate": {"failure_rate": 0.1}}, "simulate.failure_rate=0.1"),
    ({"simulate": {"pause_generation_during_sync": True}}, "pause_generation_during_sync"),
    ({"simulate": {"abort_s": 1.0}}, "simulate.abort_s=1"),
    ({"deterministic": True}, "deterministic: true"),
    ({"simulate": {"generation_latency_s": {"distribution": "tokens", "lengths": [[100, 80.0]],
                                            "base_s": 0.5, "per_token_s": 0.01}}},
     "load-dependent"),
    ({"async_rl": {"sampler": {"name": "windowed", "max_staleness_versions": 1,
                               "sample_freshest_first": True}}}, "sample_freshest_first"),
    ({"async_rl": {"sampler": {"name": "custom",
                               "target": "asyncrl.sampling.policies:WindowedSampler"}}},
     "custom"),
])
def test_what_cohort_mode_does_not_model_is_refused_by_name(override: dict, says: str) -> None:
    cfg = cohort(sim_config(policy="windowed"))
    tree = cfg.model_dump()
    for block, values in override.items():
        if isinstance(values, dict):
            tree[block].update(values)
        else:
            tree[block] = values
    with pytest.raises(ConfigError, match=r"simulate\.mode: cohort cannot") as info:
        simulate(RunConfig.model_validate(tree), steps=2)
    assert says in str(info.value) and "per_group" in str(info.value)
