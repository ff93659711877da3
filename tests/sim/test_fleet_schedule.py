"""``simulate.fleet``: a fleet whose slot count changes at given virtual times
(issue 35), against the closed form of a step-function change of slots."""

from __future__ import annotations

import pytest

from asyncrl.config import config_from_dict
from asyncrl.errors import ConfigError
from asyncrl.sim.runner import simulate
from asyncrl.sim.slots import SlotPool

from .helpers import sim_config

L = 10.0  # constant latency


def _with_fleet(cfg, fleet, **sim):
    parsed = config_from_dict({"simulate": {"fleet": fleet}}).simulate.fleet
    return cfg.model_copy(update={"simulate": cfg.simulate.model_copy(
        update={"fleet": parsed, **sim})})


def _completions(result, a: float, b: float) -> int:
    """Groups that finished generating in (a, b]."""
    return sum(1 for start, end, outcome in result.engine.intervals
               if outcome == "ok" and a < end <= b)


def test_step_change_of_slots_matches_the_closed_form() -> None:
    """Generation-bound (no trainer or sync time, a deep lookahead, in-flight
    bound far above the slots so groups always queue at the engine): S slots
    with a constant latency L complete S groups every L seconds, so the
    throughput of each phase is S/L groups/s.

    Tolerance: none beyond float rounding. With a constant latency every slot
    runs back to back (the queue never empties, so a freed slot is refilled at
    the same virtual instant), so each phase is whole waves of S completions.
    A grow at t=100 (a multiple of L) adds slots that start at once; a shrink at
    t=145 drains: the 12 groups started at t=140 all finish at t=150, after which
    only 4 slots run -- so the third phase's closed form starts at 150, not 145.
    """
    cfg = sim_config(policy="in_order", window=20, n=4, steps=60, slots=4, latency=L,
                     train_step_s=0.0, weight_sync_s=0.0)
    cfg = _with_fleet(cfg, [{"at_s": 100.0, "rollout_slots": 12},
                            {"at_s": 145.0, "rollout_slots": 4}])
    result = simulate(cfg)
    assert result.ledger["balanced"]
    assert result.virtual_time_s > 200.0  # the run covers every phase measured below
    rate = {phase: _completions(result, a, b) / (b - a)
            for phase, (a, b) in {"4 slots": (0.0, 100.0), "12 slots": (100.0, 150.0),
                                  "4 again": (150.0, 200.0)}.items()}
    assert rate == pytest.approx({"4 slots": 4 / L, "12 slots": 12 / L, "4 again": 4 / L},
                                 rel=1e-12)
    # The busiest instant had 12 groups in slots, never more (drain, not overbooking).
    assert result.engine.max_busy == 12
    # Utilisation divides by the slot-seconds the schedule offered.
    assert result.generator_util == pytest.approx(
        result.engine.busy_slot_s / cfg.simulate.slot_seconds(result.virtual_time_s))


def test_a_scheduled_change_is_a_fleet_change_for_the_controller(caplog) -> None:
    """The controller hears of every scheduled change as of a real one (the
    event the autopilot re-plans on): here the in-flight bound 4 leaves slots
    idle once the fleet has 12, which the re-check says."""
    cfg = sim_config(policy="in_order", window=1, n=4, steps=20, slots=4, latency=L,
                     train_step_s=0.0, weight_sync_s=0.0, inflight=4)
    cfg = _with_fleet(cfg, [{"at_s": 20.0, "rollout_slots": 12},
                            {"at_s": 45.0, "rollout_slots": 2}])
    with caplog.at_level("INFO", logger="asyncrl.controller"):  # the simulator keeps warnings
        result = simulate(cfg)
    assert result.ledger["balanced"]
    notes = [r.getMessage() for r in caplog.records if "generation slots" in r.getMessage()]
    assert notes == ["note: async_rl.max_inflight_prompts=4 is below the fleet's 12 generation "
                     "slots: 8 stay idle; raise it with a re-tune (or let the autopilot) to "
                     "use them"]


def test_a_fleet_schedule_is_deterministic() -> None:
    cfg = sim_config(policy="windowed", window=2, n=8, steps=20, slots=8,
                     latency={"distribution": "lognormal", "median": 10.0, "sigma": 0.8})
    cfg = _with_fleet(cfg, [{"at_s": 30.0, "rollout_slots": 2},
                            {"at_s": 90.0, "rollout_slots": 16}])
    a, b = simulate(cfg), simulate(cfg)
    assert a.engine.intervals == b.engine.intervals
    assert a.ledger["balanced"] and a.virtual_time_s == b.virtual_time_s


def test_slot_pool_shrink_drains_busy_slots_and_a_grow_repays_it() -> None:
    pool = SlotPool(3)
    assert all(pool.try_take() for _ in range(3))
    pool.resize(1)               # all three busy: two are retired when given back
    pool.give_back()             # retired (2 busy, 1 still owed)
    pool.resize(2)               # the one still owed stays after all: 2 busy of 2
    assert not pool.try_take()
    pool.give_back()             # 1 busy of 2: one free
    assert pool.try_take() and not pool.try_take()
    pool.resize(4)               # 2 busy of 4: two new ones free at once
    assert pool.try_take() and pool.try_take() and not pool.try_take()


def test_slot_pool_hands_a_freed_slot_to_the_first_waiter_that_takes_it() -> None:
    """Waiters start in arrival order, in the call that frees the slot; one that
    declines (gone while it waited) passes the slot on; with none left it is free."""
    pool = SlotPool(1)
    started: list[str] = []

    def waiter(name: str, takes: bool = True):
        def start() -> bool:
            started.append(name)
            return takes
        return start

    assert pool.try_take()
    for name, takes in (("gone", False), ("a", True), ("b", True)):
        pool.wait(waiter(name, takes))
    assert not pool.try_take()   # a waiter is first in line, even for a freed slot
    pool.give_back()
    assert started == ["gone", "a"]
    pool.give_back()
    assert started == ["gone", "a", "b"]
    pool.give_back()             # nobody waits: the slot is free
    assert pool.try_take() and not pool.try_take()


def test_fleet_schedule_is_checked() -> None:
    with pytest.raises(ConfigError, match="at_s must strictly increase"):
        config_from_dict({"simulate": {"fleet": [{"at_s": 5, "rollout_slots": 2},
                                                 {"at_s": 5, "rollout_slots": 3}]}})
    with pytest.raises(ConfigError, match="needs mode: per_group"):
        config_from_dict({"simulate": {"mode": "cohort",
                                       "fleet": [{"at_s": 5, "rollout_slots": 2}]}})
    with pytest.raises(ConfigError, match="rollout_slots"):
        config_from_dict({"simulate": {"fleet": [{"at_s": 5, "rollout_slots": 0}]}})
