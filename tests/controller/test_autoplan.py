"""The model-based autopilot modes (issue 38): what :class:`PlannedAutopilot`
does with a planner's answers - hysteresis, the gain threshold, refusals, a
plan that is still running - and the record it leaves (``autopilot/*`` step
metrics, the journal, the summary), a checkpoint and resume. The planner here
is scripted (tests/sim/test_planner.py runs the simulator's)."""

from __future__ import annotations

import concurrent.futures
import dataclasses

import pytest

from asyncrl.controller.autopilot import WindowStats
from asyncrl.controller.autoplan import PlannedAutopilot, PlanRequest, PlanResult, Prediction
from asyncrl.errors import UsageError
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.controller.test_retune import BoundChecker
from tests.fakes import FakeEngine, FakeTrainer

PILOT = {"enabled": True, "mode": "plan", "warmup_steps": 1, "replan_every_steps": 1,
         "bounds": {"max_waste_frac": 1.0}}


def _pred(inflight: int, tput: float, *, window: int = 2, cap: int = 32,
          keeps: bool = True) -> Prediction:
    return Prediction({"max_inflight_prompts": inflight, "window": window,
                       "max_buffered_rollouts": cap}, tput, 1.0, 0.0, keeps)


class ScriptedPlanner:
    """Answers each plan with the next of ``answers`` (a function of the request:
    the setting in force is the current candidate), done at once unless
    ``hold`` (then the test completes the future)."""

    def __init__(self, best_inflight: list[int | None], *, gain: float = 0.5,
                 hold: bool = False) -> None:
        self.best_inflight = list(best_inflight)
        self.gain = gain
        self.hold = hold
        self.requests: list[PlanRequest] = []
        self.futures: list[concurrent.futures.Future] = []
        self.closed = False

    def answer(self, request: PlanRequest) -> PlanResult:
        cur = request.setting
        current = _pred(cur["max_inflight_prompts"], 1.0, window=cur["window"],
                        cap=cur["max_buffered_rollouts"])
        n = self.best_inflight.pop(0) if self.best_inflight else None
        best = current if n is None else _pred(n, 1.0 + self.gain, window=cur["window"],
                                               cap=cur["max_buffered_rollouts"])
        return PlanResult({"fitted": True}, [current, best], best, current, 0.01)

    def submit(self, request: PlanRequest) -> concurrent.futures.Future:
        self.requests.append(request)
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self.hold:
            future.set_result(self.answer(request))
        self.futures.append(future)
        return future

    def close(self) -> None:
        self.closed = True


def _controller(planner, *, steps: int = 12, version: int = 0, **pilot):
    engine = FakeEngine(lambda r: 1.0 + (r.group_id % 3))
    engine.weight_version = version  # a resume loads the checkpoint's weights
    return make_controller({"name": "windowed", "max_staleness_versions": 2}, engines=[engine],
                           trainer=FakeTrainer(step_time=1.0), steps=steps, per_step=4,
                           capacity=32, min_chunk=4, inflight=8, planner=planner,
                           autopilot={**PILOT, **pilot})


def _run(ctl):
    checker = BoundChecker(ctl)
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"] and checker.violations == []
    return result


def test_a_setting_must_win_two_plans_in_a_row() -> None:
    # Plans from step 2 on: 12, 16 (a new winner each time: no change), 16 (2nd win: apply).
    planner = ScriptedPlanner([12, 16, 16])
    ctl = _controller(planner, steps=8)
    _run(ctl)
    actions = [d["action"] for d in ctl.autopilot.decisions]
    assert actions[:4] == ["candidate", "candidate", "apply", "hold"]
    assert [a["setting"]["max_inflight_prompts"] for a in ctl.retuner.applied] == [16]
    assert ctl.autopilot.changes == 1 and planner.closed


def test_a_gain_below_the_threshold_changes_nothing() -> None:
    ctl = _controller(ScriptedPlanner([12] * 8, gain=0.01), steps=8, min_gain=0.05)
    _run(ctl)
    assert not ctl.retuner.applied
    assert all("min_gain" in d["reason"] for d in ctl.autopilot.decisions)


def test_a_plan_never_blocks_the_run() -> None:
    """The planner's answer is not ready: the steps go on; it is applied at the
    first boundary after it is."""
    planner = ScriptedPlanner([12, 12], hold=True)
    ctl = _controller(planner, steps=10, wins_needed=1)

    async def answer_late(ctl, version: int) -> None:
        if version == 5:  # the first plan (asked at step 2) answers now
            future = planner.futures[0]
            future.set_result(planner.answer(planner.requests[0]))

    ctl.on_step_end = answer_late
    _run(ctl)
    assert len(planner.requests) == 2  # one at a time: the second after the first answered
    first = ctl.autopilot.decisions[0]
    assert (first["planned_at"], first["step"], first["action"]) == (2, 5, "apply")
    assert ctl.retuner.applied[0]["version"] == 5


def test_a_refused_setting_is_never_applied() -> None:
    class Refused(ScriptedPlanner):
        def answer(self, request):
            result = super().answer(request)
            bad = Prediction({**request.setting, "max_buffered_rollouts": 1}, 9.0, 0, 0, True)
            return PlanResult({}, [result.current, bad], bad, result.current, 0.0)

    ctl = _controller(Refused([]), steps=6, wins_needed=1)
    _run(ctl)
    assert not ctl.retuner.applied
    assert {d["action"] for d in ctl.autopilot.decisions} == {"refused"}
    assert "max_buffered_rollouts=1" in ctl.autopilot.decisions[0]["reason"]


def test_runtime_mode_never_asks_for_the_window() -> None:
    planner = ScriptedPlanner([12])
    ctl = _controller(planner, steps=4, mode="runtime")
    _run(ctl)
    assert planner.requests and all("window" not in r.knobs for r in planner.requests)


def test_every_decision_is_on_record() -> None:
    journal: list[dict] = []
    ctl = _controller(ScriptedPlanner([12, 12]), steps=6)
    ctl.autopilot.journal = journal.append
    result = _run(ctl)
    assert journal == list(ctl.autopilot.decisions) and len(journal) == 5
    row = journal[1]  # the second plan: the change
    assert row["action"] == "apply" and row["setting"]["max_inflight_prompts"] == 12
    assert {"step", "mode", "model", "candidates", "predicted", "measured", "previous",
            "predicted_before", "plan_s"} <= set(row)
    # What the first plan predicted for the setting it kept, beside what was measured.
    assert row["predicted_before"]["setting"]["max_inflight_prompts"] == 8
    assert row["measured"]["throughput"] > 0
    records = ctl.step_records
    assert [r["autopilot/max_inflight_prompts"] for r in records] == [8] * 3 + [12] * 3
    assert {r["autopilot/window"] for r in records} == {2}
    assert result.summary["autopilot"] == {"mode": "plan", "changes": 1, "decisions": 5,
                                           "final": {"max_inflight_prompts": 12, "window": 2,
                                                     "max_buffered_rollouts": 32}}


def test_a_resumed_run_goes_on_with_the_setting_and_the_autopilot_state() -> None:
    first = _controller(ScriptedPlanner([6, 6, 4]), steps=4)
    _run(first)
    state = first.state_dict()
    assert first.autopilot.state_dict()["wins"] == 1  # 4 won once: a candidate
    planner = ScriptedPlanner([4])
    resumed = _controller(planner, steps=9, version=4)  # the config says in-flight 8
    resumed.load_state_dict(state)
    assert resumed.dispatcher.max_inflight == 6 and resumed.autopilot.changes == 1
    _run(resumed)
    # The resumed run ran at 6 until its first plan, after its own warm-up; there
    # 4 won a second plan in a row (the win before the checkpoint counts).
    records = resumed.step_records
    assert records[0]["step"] == 4 and records[0]["autopilot/max_inflight_prompts"] == 6
    assert resumed.autopilot.decisions[0]["step"] == 6
    assert resumed.autopilot.decisions[0]["action"] == "apply"
    assert resumed.retuner.applied[0]["setting"]["max_inflight_prompts"] == 4


def test_a_model_based_mode_needs_a_planner() -> None:
    with pytest.raises(UsageError, match="needs a planner"):
        _controller(None)


def test_the_fleet_hook_warms_up_again() -> None:
    planner = ScriptedPlanner([])
    ctl = _controller(planner, steps=8)

    async def fleet(ctl, version: int) -> None:
        if version == 4:
            ctl.autopilot.fleet_changed(rollout_slots=3)

    ctl.on_step_end = fleet
    _run(ctl)
    assert isinstance(ctl.autopilot, PlannedAutopilot)
    steps = [r.step for r in planner.requests]
    assert 4 not in steps and 5 in steps  # the boundary of the change warms up again
    assert planner.requests[-1].rollout_slots == 3


def test_what_was_measured_counts_once_the_groups_started_before_the_change_are_gone() -> None:
    """After a change, the steps measured straddle two settings: the plans get no
    measurement (no bias correction, no safety-first cut) until every group
    dispatched before the change has ended and a decision window has passed
    since (at least two windows). A long tail keeps such groups for several
    steps: two windows alone would read a measurement of the old setting."""
    planner = ScriptedPlanner([12, 12])
    ctl = _controller(planner, steps=9)
    seen: dict[int, tuple[int | None, int]] = {}

    async def watch(ctl, version: int) -> None:
        seen[ctl.ctx.stats.steps_done] = (ctl.buffer.oldest_seq(), ctl.buffer.next_seq)

    ctl.on_step_end = watch
    _run(ctl)
    changed = [d["step"] for d in ctl.autopilot.decisions if d["action"] == "apply"]
    assert changed == [3]  # 12 applied at step 3 (its second win)
    before = seen[3][1]
    gone = min(s for s, (oldest, _) in seen.items()
               if s > 3 and (oldest is None or oldest >= before))
    measured = {r.step: r.measured is not None for r in planner.requests}
    expected = {r: r <= 3 or (r - gone >= 1 and r - 3 >= 2) for r in measured}
    assert measured == expected and gone > 4, (measured, gone)


def test_no_knob_widens_before_the_last_change_has_shown() -> None:
    """Until the groups dispatched before a change are gone, a plan has only the
    model (no measured bias): it may cut again, but a widening waits."""
    planner = ScriptedPlanner([12, 12] + [16] * 10)
    ctl = _controller(planner, steps=12)
    _run(ctl)
    measured = {r.step: r.measured is not None for r in planner.requests}
    decisions = {d["step"]: d for d in ctl.autopilot.decisions}
    held = [s for s, d in decisions.items() if d["reason"].startswith("the last change has not")]
    assert held and not any(measured[s] for s in held)
    applied = [s for s, d in decisions.items() if d["action"] == "apply"]
    assert applied[0] == 3 and len(applied) == 2
    # 16 won its plans only once settled: both wins were asked for with a measurement.
    assert decisions[applied[1]]["setting"]["max_inflight_prompts"] == 16
    assert measured[applied[1]] and measured[applied[1] - 1]


def test_a_decision_measures_the_fit_window_but_nothing_before_the_last_change_settled() -> None:
    """What the run measured (the bias, the safety-first cut) spans the fit window:
    a staleness p95 over one short decision window is noise, and one noisy window
    must not cut the window to 0 (bench_autopilot, seed 1). After a change it
    spans only the steps since the groups dispatched before it were gone."""
    planner = ScriptedPlanner([12, 12])
    ctl = _controller(planner, steps=14, fit_steps=4)
    seen: dict[int, tuple[int | None, int]] = {}

    async def watch(ctl, version: int) -> None:
        seen[ctl.ctx.stats.steps_done] = (ctl.buffer.oldest_seq(), ctl.buffer.next_seq)

    ctl.on_step_end = watch
    _run(ctl)
    assert [d["step"] for d in ctl.autopilot.decisions if d["action"] == "apply"] == [3]
    gone = min(s for s, (oldest, _) in seen.items()
               if s > 3 and (oldest is None or oldest >= seen[3][1]))
    records = ctl.step_records
    spans = []
    for request in planner.requests:
        if request.measured is None:
            continue
        span = max(1, min(4, request.step if request.step <= 3 else request.step - gone))
        spans.append(span)
        assert request.measured == dataclasses.asdict(
            WindowStats.of(records[:request.step][-span:])), (request.step, span)
    assert 4 in spans and any(1 < s < 4 for s in spans), spans
