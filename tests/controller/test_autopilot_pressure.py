"""``autopilot.mode: aimd`` from the engines' load (issue 38, Build item 2):
trim above ``kv_high``, cut on preemption, grow by ``grow_factor`` below
``kv_low`` - the rule on hand-written numbers, then whole runs in virtual time
(the simulator's fleet, and a fake engine that thrashes)."""

from __future__ import annotations

import logging
import math

import pytest

from asyncrl.config import AutopilotConfig
from asyncrl.controller.autopilot import Autopilot, read_pressure
from asyncrl.engines import EngineCapabilities, EnginePressure
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.runner import simulate
from tests.controller.conftest import make_controller
from tests.controller.test_autopilot import _pilot, _record, _Retuner
from tests.controller.test_retune import BoundChecker
from tests.fakes import FakeEngine, FakeTrainer, PressuredEngine
from tests.sim.helpers import sim_config


def _load(kv: float | None, preemptions: int = 0, running: int = 4,
          waiting: int = 0) -> EnginePressure:
    return EnginePressure(running, waiting, kv, preemptions)


# ------------------------------------------------------------------ the rule
def test_kv_above_the_high_mark_trims_even_while_the_trainer_idles() -> None:
    pilot, retuner = _pilot(20, trim=0.8)
    pilot.after_step(1, [_record(idle=5.0, inflight=20)], pressure=_load(0.95))
    assert retuner.asked == [16]
    decision = pilot.decisions[-1]
    assert decision["action"] == "decrease" and "KV cache 0.950 > kv_high 0.9" in decision["reason"]
    assert decision["pressure"] == {"running": 4, "waiting": 0, "kv_cache_usage": 0.95,
                                    "preemptions": 0, "sources": 1}
    # A trim latches like a cut: 18 still in flight above the new bound of 16.
    pilot.after_step(2, [_record(idle=5.0, inflight=18)], pressure=_load(0.95))
    assert retuner.asked == [16] and pilot.decisions[-1]["action"] == "hold"


def test_preemptions_since_the_last_decision_cut_by_decrease() -> None:
    pilot, retuner = _pilot(20, decrease=0.5)
    # The first reading is the baseline: what came before is not this window's.
    pilot.after_step(1, [_record(inflight=20)], pressure=_load(0.3, preemptions=7))
    assert retuner.asked == []
    pilot.after_step(2, [_record(inflight=20)], pressure=_load(0.3, preemptions=9))
    assert retuner.asked == [10]
    assert pilot.decisions[-1]["reason"] == "2 preemptions since the last decision"
    # Preemptions while the cut drains move the baseline, and cut nothing more.
    pilot.after_step(3, [_record(inflight=15)], pressure=_load(0.3, preemptions=12))
    pilot.after_step(4, [_record(inflight=10)], pressure=_load(0.3, preemptions=12))
    assert retuner.asked == [10]
    # A counter that went back (an engine restarted or left) is a new baseline.
    pilot.after_step(5, [_record(inflight=10)], pressure=_load(0.3, preemptions=1))
    assert retuner.asked == [10] and pilot.decisions[-1]["action"] == "hold"


def test_an_idle_trainer_grows_by_the_factor_below_the_low_mark_else_additively() -> None:
    pilot, retuner = _pilot(12, increase=4, grow_factor=1.5)
    pilot.after_step(1, [_record(idle=5.0, inflight=12)], pressure=_load(0.2))
    assert retuner.asked == [18]
    assert "KV cache 0.200 < kv_low 0.5" in pilot.decisions[-1]["reason"]
    pilot.after_step(2, [_record(idle=5.0, inflight=18)], pressure=_load(0.7))
    assert retuner.asked == [18, 22]  # between the marks: + increase
    # A small bound grows by at least `increase` groups.
    pilot, retuner = _pilot(2, increase=4, grow_factor=1.5)
    pilot.after_step(1, [_record(idle=5.0, inflight=2)], pressure=_load(0.1))
    assert retuner.asked == [6]


def test_a_broken_bound_comes_before_the_engines_room() -> None:
    pilot, retuner = _pilot(20, decrease=0.5)
    pilot.after_step(1, [_record(idle=5.0, trained=8, evicted=2, inflight=20)],
                     pressure=_load(0.1))
    assert retuner.asked == [10] and pilot.decisions[-1]["reason"].startswith("waste")


def test_an_engine_without_kv_numbers_leaves_the_step_record_rule() -> None:
    pilot, retuner = _pilot(8, increase=3)
    pilot.after_step(1, [_record(idle=2.0)], pressure=_load(None))
    assert retuner.asked == [11]
    assert pilot.decisions[-1]["reason"] == "trainer idle 0.200 > 0.05"


def test_pressure_is_wanted_only_where_an_aimd_decision_reads_it() -> None:
    """The controller asks just before each step's after_step; the read waits on
    the engines, so only a decision due reads them."""
    def wanted(**cfg) -> tuple[list[int], list[int]]:
        pilot = Autopilot(AutopilotConfig(enabled=True, warmup_steps=1, replan_every_steps=2,
                                          **cfg), _Retuner(8))  # type: ignore[arg-type]
        asked = []
        for step in range(1, 10):
            if pilot.wants_pressure(step):
                asked.append(step)
            pilot.after_step(step, [_record()] * 2)
        return asked, [d["step"] for d in pilot.decisions]

    assert wanted() == ([3, 5, 7, 9], [3, 5, 7, 9])
    assert wanted(freeze_after_steps=5) == ([3, 5], [3, 5])
    assert wanted(engine_signals=False) == ([], [3, 5, 7, 9])


def test_pressure_is_checked_and_combined() -> None:
    with pytest.raises(ValueError, match=r"kv_cache_usage is 1.5; .* in \[0, 1\]"):
        EnginePressure(1, 0, 1.5, 0)
    with pytest.raises(ValueError, match="waiting is -1"):
        EnginePressure(1, -1, None, 0)
    both = EnginePressure.combine([_load(0.4, 3, running=2, waiting=1), None,
                                   _load(None, 1, running=5), _load(0.7, 0)])
    assert both == EnginePressure(11, 1, 0.7, 4, sources=3)
    assert EnginePressure.combine([None, None]) is None
    assert EngineCapabilities.of(PressuredEngine(room=4)).pressure
    assert not EngineCapabilities.of(FakeEngine()).pressure


def test_the_controller_reads_the_engines_that_report_and_survives_a_failing_one(
        caplog) -> None:
    class Broken(FakeEngine):
        async def pressure(self) -> EnginePressure:
            raise RuntimeError("metrics endpoint down")

    engines = [PressuredEngine(room=4), Broken(), FakeEngine()]
    caps = [EngineCapabilities.of(e) for e in engines]
    with caplog.at_level(logging.WARNING, "asyncrl.controller"):
        assert run_virtual(read_pressure(engines, caps)) == EnginePressure(0, 0, 0.0, 0)
    assert "Broken.pressure() failed (RuntimeError('metrics endpoint down'))" in caplog.text
    assert engines[0].reads == 1
    assert run_virtual(read_pressure(engines[2:], caps[2:])) is None


# ------------------------------------------------------- runs in virtual time
def _sim(autopilot: dict, **cfg):
    return simulate(sim_config(policy="windowed", n=8, steps=30, latency=10.0, min_chunk=8,
                               autopilot={"enabled": True, "bounds": {"max_waste_frac": None},
                                          **autopilot}, **cfg))


def test_a_full_simulated_fleet_trims_the_bound() -> None:
    """48 groups in flight on 16 slots: the slots are full (the simulator's KV
    proxy is 1.0) and groups queue. aimd trims; without engine signals the idle
    trainer keeps the bound at its clamp."""
    cfg = {"window": 4, "slots": 16, "capacity": 48, "inflight": 48}
    tuned = _sim({"trim": 0.9}, **cfg)
    assert tuned.ledger["balanced"]
    trims = [d for d in tuned.autopilot if "kv_high" in d["reason"]]
    assert len(trims) >= 3 and all(d["pressure"]["kv_cache_usage"] > 0.9 for d in trims)
    assert all(d["max_inflight_prompts"] == math.floor(d["previous"]["max_inflight_prompts"] * 0.9)
               for d in trims)
    assert tuned.autopilot[-1]["max_inflight_prompts"] < 24
    blind = _sim({"engine_signals": False}, **cfg)
    assert {d["max_inflight_prompts"] for d in blind.autopilot} == {48}
    assert all(d["pressure"] is None for d in blind.autopilot)


def test_a_simulated_fleet_with_room_grows_the_bound_by_the_factor() -> None:
    """2 groups in flight on 64 slots: the trainer idles and the fleet is nearly
    empty, so the bound doubles each decision (``increase`` alone adds 1)."""
    cfg = {"window": 2, "slots": 64, "capacity": 64, "inflight": 2}
    tuned = _sim({"increase": 1, "grow_factor": 2.0}, **cfg)
    grown = [d["max_inflight_prompts"] for d in tuned.autopilot
             if "kv_low" in d["reason"]][:4]
    assert grown == [4, 8, 16, 32]
    blind = _sim({"increase": 1, "grow_factor": 2.0, "engine_signals": False}, **cfg)
    assert [d["max_inflight_prompts"] for d in blind.autopilot][:4] == [3, 4, 5, 6]
    assert tuned.virtual_time_s < 0.8 * blind.virtual_time_s


def _thrashing_run(preempt_over: int | None):
    engine = PressuredEngine(2.0, room=64, preempt_over=preempt_over)
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 4}, engines=[engine],
                          trainer=FakeTrainer(step_time=1.0), steps=30, per_step=8,
                          capacity=48, min_chunk=8, inflight=40,
                          autopilot={"enabled": True, "decrease": 0.7,
                                     "bounds": {"max_waste_frac": None}})
    checker = BoundChecker(ctl)
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"] and checker.violations == []
    return ctl, engine


def test_an_engine_that_preempts_gets_its_bound_cut() -> None:
    """The engine preempts whenever 12 or more groups generate (its KV cache is
    small, though it says it is mostly free): aimd cuts on every new preemption
    and ends near 12; the same engine without preemptions keeps the bound."""
    ctl, engine = _thrashing_run(12)
    cuts = [d for d in ctl.autopilot.decisions if "preemptions since" in d["reason"]]
    assert cuts and all(d["action"] == "decrease" for d in cuts)
    assert all(d["max_inflight_prompts"] == math.floor(d["previous"]["max_inflight_prompts"] * 0.7)
               for d in cuts)
    assert max(d["max_inflight_prompts"] for d in list(ctl.autopilot.decisions)[2:]) <= 20
    # One read per decision, at the step boundary it was made at.
    assert engine.reads == len(ctl.autopilot.decisions)
    calm, _ = _thrashing_run(None)
    assert {d["max_inflight_prompts"] for d in calm.autopilot.decisions} == {40}


def test_an_engine_that_missed_a_read_brings_back_no_false_preemptions() -> None:
    """Counters summed over another set of engines are a new baseline: a server
    that missed one read (timeout, restart) and answers again brings its whole
    count back, which is no preemption since the last decision."""
    pilot, retuner = _pilot(20, decrease=0.5)
    two = EnginePressure.combine([_load(0.3, preemptions=40), _load(0.3, preemptions=2)])
    pilot.after_step(1, [_record(inflight=20)], pressure=two)
    one = EnginePressure.combine([_load(0.3, preemptions=2), None])
    pilot.after_step(2, [_record(inflight=20)], pressure=one)
    pilot.after_step(3, [_record(inflight=20)], pressure=two)
    assert retuner.asked == [] and {d["action"] for d in pilot.decisions} == {"hold"}
    # The same set again, one more preemption: that is a cut.
    more = EnginePressure.combine([_load(0.3, preemptions=41), _load(0.3, preemptions=2)])
    pilot.after_step(4, [_record(inflight=20)], pressure=more)
    assert retuner.asked == [10]


def test_growth_by_the_factor_stops_at_the_last_cut() -> None:
    """After a cut, growth by grow_factor reaches at most the bound the cut left
    (then + increase), so a preemption cut and a growth below kv_low do not
    alternate between the same two bounds."""
    pilot, retuner = _pilot(40, decrease=0.5, increase=2, grow_factor=2.0)
    pilot.after_step(1, [_record(inflight=40)], pressure=_load(0.3, preemptions=0))
    pilot.after_step(2, [_record(inflight=40)], pressure=_load(0.3, preemptions=3))
    assert retuner.asked == [20]  # cut; the limit is 20 now
    pilot.after_step(3, [_record(idle=5.0, inflight=20)], pressure=_load(0.1, preemptions=3))
    assert retuner.asked == [20, 22]  # at the limit: additive, not 40
    assert pilot.state_dict()["grow_limit"] == 20
