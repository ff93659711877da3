"""``async_rl.autopilot`` with ``mode: aimd`` (issue 38): the decision rule on
hand-written step records, then whole runs in virtual time."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from asyncrl.config import AsyncRLConfig, AutopilotConfig
from asyncrl.controller.autopilot import Autopilot, WindowStats
from asyncrl.controller.retune import Setting
from asyncrl.errors import SetupError
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.controller.test_deterministic import PinnedEngine
from tests.controller.test_retune import BoundChecker
from tests.fakes import FakeEngine, FakeTrainer


def _record(*, idle: float = 0.0, trained: int = 4, evicted: int = 0, aborted: int = 0,
            staleness: dict[str, int] | None = None, inflight: int = 4) -> dict:
    return {"step_time_s": 10.0, "trainer_idle_s": idle, "groups_trained": trained,
            "groups_evicted": evicted, "groups_aborted": aborted,
            "staleness_hist": staleness or {"0": trained}, "inflight": inflight}


class _Retuner:
    """The two members Autopilot uses, recording what it asks for."""

    def __init__(self, inflight: int, capacity: int = 32) -> None:
        self.target = Setting(inflight, 1, capacity)
        self.asked: list[int] = []

    def request(self, *, max_inflight_prompts: int) -> None:
        self.asked.append(max_inflight_prompts)
        self.target = dataclasses.replace(self.target, max_inflight_prompts=max_inflight_prompts)


def _pilot(inflight: int = 8, **cfg) -> tuple[Autopilot, _Retuner]:
    retuner = _Retuner(inflight)
    config = AutopilotConfig(enabled=True, warmup_steps=0, replan_every_steps=1, **cfg)
    return Autopilot(config, retuner), retuner  # type: ignore[arg-type]


def test_window_stats() -> None:
    stats = WindowStats.of([_record(idle=5.0, trained=8, evicted=1, aborted=1,
                                    staleness={"0": 10, "3": 1}),
                            _record(idle=0.0, trained=10, staleness={"1": 9}, inflight=7)])
    assert stats.idle_frac == pytest.approx(0.25)
    assert stats.waste_frac == pytest.approx(2 / 20)
    assert stats.staleness_p95 == 1.0 and stats.inflight == 7


def test_an_idle_trainer_grows_the_bound_additively() -> None:
    pilot, retuner = _pilot(8, increase=3)
    for step in (1, 2):
        pilot.after_step(step, [_record(idle=2.0)])
    assert retuner.asked == [11, 14]
    assert [d["action"] for d in pilot.decisions] == ["increase", "increase"]


def test_a_broken_bound_cuts_multiplicatively_then_drains() -> None:
    pilot, retuner = _pilot(20, decrease=0.5)
    pilot.after_step(1, [_record(idle=2.0, trained=8, evicted=2, inflight=20)])
    assert retuner.asked == [10]
    # Still 15 in flight (above the new bound): hold, even though the waste persists.
    pilot.after_step(2, [_record(trained=8, evicted=2, inflight=15)])
    assert retuner.asked == [10] and pilot.decisions[-1]["action"] == "hold"
    pilot.after_step(3, [_record(trained=8, evicted=2, inflight=10)])
    assert retuner.asked == [10, 5]


def test_the_staleness_bound_cuts_too() -> None:
    pilot, retuner = _pilot(10, bounds={"max_staleness_p95": 1})
    pilot.after_step(1, [_record(idle=5.0, staleness={"2": 4}, inflight=0)])
    assert retuner.asked == [7]


def test_clamps_warmup_and_freeze() -> None:
    retuner = _Retuner(4, capacity=6)
    pilot = Autopilot(AutopilotConfig(enabled=True, warmup_steps=2, replan_every_steps=2,
                                      freeze_after_steps=6, increase=4), retuner)  # type: ignore[arg-type]
    for step in range(1, 10):
        pilot.after_step(step, [_record(idle=5.0)] * 2)
    # Decisions at steps 4 and 6 only (after the warm-up, every 2, frozen after 6);
    # the bound stops at the buffer capacity.
    assert [d["step"] for d in pilot.decisions] == [4, 6]
    assert retuner.asked == [6]


def test_config_refuses_inverted_clamps() -> None:
    with pytest.raises(ValidationError, match="max_inflight=2 is below min_inflight=3"):
        AutopilotConfig(min_inflight=3, max_inflight=2)
    with pytest.raises(ValidationError):
        AsyncRLConfig(autopilot={"enabled": True, "mode": "sometimes"})


def test_deterministic_mode_refuses_the_autopilot() -> None:
    with pytest.raises(SetupError, match="autopilot"):
        make_controller({"name": "in_order", "max_lookahead_versions": 1},
                        engines=[PinnedEngine(lambda _r: 1.0)], deterministic=True,
                        autopilot={"enabled": True})


def _run(inflight: int, autopilot: dict | None, **kw):
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2},
                          engines=[FakeEngine(lambda _r: 4.0)],
                          trainer=FakeTrainer(step_time=1.0), steps=30, per_step=8,
                          capacity=32, min_chunk=8, inflight=inflight,
                          **({"autopilot": autopilot} if autopilot else {}), **kw)
    checker = BoundChecker(ctl)
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"] and checker.violations == []
    return ctl, result


def test_aimd_lifts_a_starved_run() -> None:
    """Start at an in-flight bound of 1 with 4 s generations and 1 s steps: the
    trainer idles. aimd raises the bound and the run finishes much sooner."""
    fixed, _ = _run(1, None)
    tuned, _ = _run(1, {"enabled": True, "increase": 4})
    assert tuned.retuner.applied, "the autopilot never re-tuned"
    assert tuned.ctx.stats.max_inflight_seen > 8
    fixed_s = fixed.step_records[-1]["wall_time_s"]
    tuned_s = tuned.step_records[-1]["wall_time_s"]
    assert tuned_s < 0.5 * fixed_s, (tuned_s, fixed_s)


def test_aimd_backs_off_when_waste_breaks_the_bound() -> None:
    """Window 0 with 32 groups in flight: most are aborted at each sync. aimd cuts."""
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 0},
                          engines=[FakeEngine(lambda r: 1.0 + (r.group_id % 5))],
                          trainer=FakeTrainer(step_time=0.5), steps=30, per_step=4,
                          capacity=32, min_chunk=1, inflight=32,
                          autopilot={"enabled": True, "bounds": {"max_waste_frac": 0.1}})
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"]
    actions = [d["action"] for d in ctl.autopilot.decisions]
    assert "decrease" in actions
    assert ctl.dispatcher.max_inflight < 32


def test_a_move_the_clamp_decides_is_labelled_by_its_direction() -> None:
    """A bound configured above the clamp (default: the buffer capacity, 32 here):
    the first 'increase' is clamped down to 32, and says it went down and why."""
    pilot, retuner = _pilot(40)
    pilot.after_step(1, [_record(idle=5.0, inflight=40)])
    decision = pilot.decisions[-1]
    assert retuner.asked == [32] and decision["action"] == "decrease"
    assert decision["reason"] == ("trainer idle 0.500 > 0.05; clamped to 32 (min_inflight / "
                                  "max_inflight, by default the buffer capacity)")
