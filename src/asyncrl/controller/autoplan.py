"""The model-based modes of ``async_rl.autopilot``: ``runtime`` and ``plan``.

Every ``replan_every_steps`` steps after the warm-up the autopilot hands a
:class:`PlanRequest` - the setting in force, the knobs it may move, the
bounds, the run's own recent steps (the newest ``fit_steps`` step records
and the timeline of the same stretch) and its live groups now (a
:class:`~asyncrl.controller.snapshot.RunState`, taken only then) - to a
:class:`Planner`. The planner fits a model of the run to that window and
searches the settings one bounded move away, each simulated from the run's
state (``asyncrl.sim.planner`` is the built-in one: the ``--calibrate`` fit
and the simulator). Planning never blocks the run: the request is
*submitted* and the answer is read at a later step boundary when it is ready
(a planner in a process); in virtual time the planner answers at once, since
the simulated clock does not move while it thinks.

What an answer may change (the lessons of the measurement-driven tuners):

* only a setting that keeps the bounds (predicted), and only when the plan
  predicts a gain of at least ``min_gain`` over the setting in force - or the
  setting in force is predicted to break a bound;
* **hysteresis**: the same setting must win ``wins_needed`` plans in a row
  (one is enough when the run measured a broken bound and the plan
  predicts the setting in force breaks it again: safety first). The run is
  measured over its last ``fit_steps`` steps, at least a decision window (a
  staleness p95 over a few steps is noise), none from before the last
  change's groups were gone. What the run
  measured counts only once the steps measured ran under the setting in force:
  every group dispatched before the change has ended, and a decision window
  has passed since (at least two decision windows after the change). Until
  then a plan gets no measured bias, no safety-first cut, and may not widen
  any knob (the model alone must not undo a cut the measurement asked for);
* the candidates are bounded moves (the planner's side of the contract);
* the Retuner checks the derived facts again, and a setting it refuses is
  never applied (the decision says so).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from asyncrl.config.autopilot import AutopilotConfig
from asyncrl.controller.autopilot import Autopilot, WindowStats
from asyncrl.controller.retune import Retuner, Setting
from asyncrl.controller.snapshot import RunState, run_state
from asyncrl.engines.capabilities import EnginePressure
from asyncrl.errors import RetuneRefused, UsageError

#: The keys of a step record a plan reads (the rest stays in the run).
RECORD_KEYS = ("step", "wall_time_s", "step_time_s", "trainer_idle_s", "weight_sync_s",
               "groups_trained", "groups_evicted", "groups_aborted", "staleness_hist",
               "inflight", "rollout/generated_tokens", "rollout/trained_tokens")


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What a planner gets: plain data (it may cross into another process)."""

    step: int
    setting: dict[str, Any]
    #: The knobs the plan may move (``window`` absent in ``runtime`` mode).
    knobs: tuple[str, ...]
    bounds: dict[str, float | None]
    objective: str
    max_move: float
    plan_steps: int
    #: The newest step records (:data:`RECORD_KEYS` only), oldest first.
    records: list[dict[str, Any]]
    #: The timeline's intervals of the same stretch (``kind``, ``lane``,
    #: ``start``, ``end``, ``label``), on the records' clock (``wall_time_s``).
    intervals: list[dict[str, Any]]
    engines: int
    #: Generation slots when known (the elastic fleet's hook), else None.
    rollout_slots: int | None = None
    #: The run's ``async_rl.sampler`` block (None: the planner's config's).
    sampler: dict[str, Any] | None = None
    #: What the newest ``fit_steps`` steps (at least ``replan_every_steps``)
    #: measured under the setting in force
    #: (:class:`~asyncrl.controller.autopilot.WindowStats` as a dict).
    measured: dict[str, Any] | None = None
    #: The run's live groups at this step boundary, which a plan starts from
    #: (:mod:`asyncrl.controller.snapshot`; None: a request built by hand).
    state: RunState | None = None


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A candidate setting and what the model predicts for it."""

    setting: dict[str, Any]
    throughput: float
    staleness_p95: float
    waste_frac: float
    keeps_bounds: bool
    #: Planned from the setting in force (``asyncrl.sim.planner.predict``): the
    #: staleness p95 of the steps from the switch on, the transition included
    #: (``staleness_p95`` is the steady state's, past the settle point; from
    #: the run's state every simulated step from the switch on, else the
    #: ``plan_steps`` after it), and
    #: how many steps after the switch it settled (None: the candidate ran from
    #: an empty pipeline, or did not settle in time and its bounds were checked
    #: from the switch on).
    transition_p95: float | None = None
    settled_after: int | None = None
    #: Planned from the run's state: the waste of the steps from the switch on
    #: (with ``transition_p95``, over the whole simulated horizon; the bounds
    #: are judged on it too). None otherwise.
    transition_waste: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PlanResult:
    """A planner's answer: the fitted model, every candidate, the best one."""

    model: dict[str, Any]
    candidates: list[Prediction]
    #: The best candidate that keeps the bounds, else the nearest (None: no data).
    best: Prediction | None
    #: The prediction for the setting in force (it is always a candidate).
    current: Prediction | None
    plan_s: float
    note: str = ""


@runtime_checkable
class Planner(Protocol):
    """Plans a setting from a :class:`PlanRequest` without blocking the run."""

    def submit(self, request: PlanRequest) -> concurrent.futures.Future[PlanResult]:
        """Start a plan; called at a step boundary, at most one at a time."""
        ...

    def close(self) -> None:
        """The run ended: stop what runs (a plan still running is dropped)."""
        ...


class PlannedAutopilot(Autopilot):
    """``runtime`` / ``plan``: a plan every ``replan_every_steps`` steps, applied
    with hysteresis (see the module docstring)."""

    def __init__(self, cfg: AutopilotConfig, retuner: Retuner, planner: Planner,
                 engines: int) -> None:
        super().__init__(cfg, retuner)
        self.planner = planner
        self.engines = engines
        self.rollout_slots: int | None = None
        self._running: concurrent.futures.Future[PlanResult] | None = None
        self._asked_at = 0
        #: The setting that won the last plans, and how many in a row.
        self._winner: dict[str, Any] | None = None
        self._wins = 0
        #: What the last plan predicted for the setting it left in force.
        self._predicted: dict[str, Any] | None = None
        #: The step boundary of the last change this autopilot asked for, the
        #: buffer's next dispatch seq then (every group below it started under
        #: the setting before), and the step its last such group ended.
        self._changed_at: int | None = None
        self._before_seq: int | None = None
        self._gone_at: int | None = None
        #: Whether the plan in flight was asked for with a settled measurement.
        self._asked_settled = True

    def at_boundary(self, steps_done: int, records: list[dict[str, Any]], *, due: bool,
                    pressure: EnginePressure | None = None) -> None:
        # (The engines' pressure is aimd's: a plan reads the step records.)
        if self._gone_at is None and self._before_seq is not None:
            oldest = self.retuner.ctx.buffer.oldest_seq()
            if oldest is None or oldest >= self._before_seq:
                self._gone_at = steps_done
        if self._running is not None and self._running.done():
            future, self._running = self._running, None
            self._answer(steps_done, records, future)
        if due and self._running is None:
            self._asked_at = steps_done
            self._asked_settled = self._settled(steps_done)
            self._running = self.planner.submit(self._request(steps_done, records))
            if self._running.done():  # an inline planner (virtual time): use it now
                future, self._running = self._running, None
                self._answer(steps_done, records, future)

    def _request(self, steps_done: int, records: list[dict[str, Any]]) -> PlanRequest:
        cfg = self.cfg
        window = records[-cfg.fit_steps:]
        return PlanRequest(
            step=steps_done, setting=self.retuner.target.as_dict(), knobs=cfg.plan_knobs,
            bounds=cfg.bounds.model_dump(), objective=cfg.objective, max_move=cfg.max_move,
            plan_steps=cfg.plan_steps,
            records=[{k: r[k] for k in RECORD_KEYS if k in r} for r in window],
            intervals=self._intervals(window), engines=self.engines,
            rollout_slots=self.rollout_slots,
            sampler=self.retuner.ctx.cfg.sampler.model_dump(mode="json"),
            measured=(dataclasses.asdict(WindowStats.of(records[-self._measure_steps(steps_done):]))
                      if self._asked_settled else None),
            state=run_state(self.retuner.ctx, self.retuner.dispatcher))

    def _settled(self, steps_done: int) -> bool:
        """True when the steps measured ran under the setting in force: a change
        shows in the trained groups only once those dispatched before it are
        gone (a long tail keeps them for many steps) and a decision window has
        passed since, and a cut whose effect has not shown yet must not be cut
        again (aimd's drain latch, for the plan)."""
        if self._changed_at is None:
            return True
        every = self.cfg.replan_every_steps
        return (self._gone_at is not None and steps_done - self._gone_at >= every
                and steps_done - self._changed_at >= 2 * every)

    def _measure_steps(self, steps_done: int) -> int:
        """Steps a decision's measurement spans: the fit window, but none from
        before the last change's groups were gone; at least a decision window.
        (A staleness p95 over a few steps is noisy: one noisy decision window
        must not trigger a safety-first cut.)"""
        every, span = self.cfg.replan_every_steps, self.cfg.fit_steps
        if self._gone_at is not None:
            span = min(span, steps_done - self._gone_at)
        return max(every, span)

    def _intervals(self, window: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The timeline since the step before the window began, newest last: read
        backwards from the end (intervals are added as they end), so the cost is
        the window's, not the run's."""
        ctx = self.retuner.ctx
        since = window[0]["wall_time_s"] - window[0]["step_time_s"]
        t0 = ctx.stats.t0
        out = []
        for i in reversed(ctx.timeline.intervals):
            if i.end - t0 < since:
                break
            out.append({"kind": i.kind, "lane": i.lane, "start": i.start - t0,
                        "end": i.end - t0, "label": i.label})
        out.reverse()
        return out

    def _answer(self, steps_done: int, records: list[dict[str, Any]],
                future: concurrent.futures.Future[PlanResult]) -> None:
        measured = WindowStats.of(records[-self._measure_steps(steps_done):])
        base = {"step": steps_done, "planned_at": self._asked_at,
                "previous": self.retuner.target.as_dict(),
                "measured": dataclasses.asdict(measured),
                # What the last plan predicted for the setting in force, beside
                # what the steps since then measured.
                "predicted_before": self._predicted}
        try:
            result = future.result()
        except Exception as exc:  # a failed plan changes nothing; the run goes on
            self._winner, self._wins = None, 0
            self.record({**base, "action": "hold", "reason": f"plan failed: {exc!r}",
                         "setting": base["previous"]}, changed=False)
            return
        self.model = result.model or self.model  # ({} when there was too little to fit)
        action, reason, chosen = self._choose(result, measured)
        changed = False
        if chosen is not None:
            try:
                self.retuner.request(**_knobs(chosen.setting, self.cfg.plan_knobs))
                changed = True
                self._changed_at = steps_done
                self._before_seq = self.retuner.ctx.buffer.next_seq
                self._gone_at = None
                self._winner, self._wins = None, 0
            except RetuneRefused as exc:
                action, reason = "refused", str(exc)
        kept = chosen if changed else result.current
        self._predicted = kept.as_dict() if kept is not None else None
        asked = self.retuner.pending or self.retuner.target  # applied at this boundary
        self.record({**base, "action": action, "reason": reason, "setting": asked.as_dict(),
                     "predicted": self._predicted, "model": result.model,
                     "candidates": [c.as_dict() for c in result.candidates],
                     "plan_s": result.plan_s}, changed=changed)

    def _choose(self, result: PlanResult,
                measured: WindowStats) -> tuple[str, str, Prediction | None]:
        """The decision on one plan: (action, reason, the setting to apply or None)."""
        best, current = result.best, result.current
        if best is None or current is None:
            self._winner, self._wins = None, 0
            return "hold", result.note or "no candidate", None
        if best.setting == current.setting:
            self._winner, self._wins = None, 0
            return "hold", "the setting in force is the best", None
        gain = best.throughput / current.throughput - 1 if current.throughput > 0 else math.inf
        settled = self._asked_settled
        if not settled and _widens(best.setting, current.setting):
            # What the last change did has not shown yet: the model alone (no
            # measured bias) must not undo a cut the measurement asked for.
            self._winner, self._wins = None, 0
            return "hold", "the last change has not shown yet: no widening until it has", None
        broken = not current.keeps_bounds or (settled and not measured.keeps(self.cfg))
        if gain < self.cfg.min_gain and not broken and self.cfg.objective == "throughput":
            self._winner, self._wins = None, 0
            return "hold", f"predicted gain {gain:+.1%} < min_gain {self.cfg.min_gain:g}", None
        self._wins = self._wins + 1 if best.setting == self._winner else 1
        self._winner = best.setting
        why = ("the setting in force breaks a bound" if broken
               else f"predicted gain {gain:+.1%}")
        if not best.keeps_bounds:
            why += " and no candidate keeps them: the nearest"
        # Safety first: a bound the run measured broken, and the model predicts
        # broken again, is no noise to wait out.
        needed = 1 if not current.keeps_bounds and settled and not measured.keeps(self.cfg) \
            else self.cfg.wins_needed
        if self._wins < needed:
            return "candidate", f"{why}; won {self._wins}/{self.cfg.wins_needed} plans", None
        return "apply", f"{why}; won {self._wins} plan{'s' * (self._wins != 1)} in a row", best

    def fleet_changed(self, rollout_slots: int) -> None:
        super().fleet_changed(rollout_slots)
        self.rollout_slots = rollout_slots
        self._winner, self._wins = None, 0

    def close(self) -> None:
        self.planner.close()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "winner": self._winner, "wins": self._wins,
                "predicted": self._predicted, "changed_at": self._changed_at,
                "before_seq": self._before_seq, "gone_at": self._gone_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if state.get("mode") == self.cfg.mode:
            self._winner, self._wins = state.get("winner"), int(state.get("wins", 0))
            self._predicted = state.get("predicted")
            self._changed_at = state.get("changed_at")
            self._before_seq = state.get("before_seq")
            self._gone_at = state.get("gone_at")


def _widens(new: dict[str, Any], old: dict[str, Any]) -> bool:
    """True when ``new`` raises a knob of ``old`` (more in flight, a wider
    window, a bigger buffer)."""
    return any(new[k] is not None and old[k] is not None and new[k] > old[k] for k in new)


def _knobs(setting: dict[str, Any], knobs: Sequence[str]) -> dict[str, int]:
    return {k: int(setting[k]) for k in knobs if setting.get(k) is not None}


def build_autopilot(cfg: AutopilotConfig, retuner: Retuner, planner: Planner | None,
                    engines: int) -> Autopilot | None:
    """The autopilot ``cfg`` asks for (None when off), its ``autopilot/*``
    numbers added to every step record."""
    if not cfg.enabled:
        return None
    if cfg.mode == "aimd":
        pilot: Autopilot = Autopilot(cfg, retuner)
    elif planner is None:
        raise UsageError(
            f"async_rl.autopilot.mode: {cfg.mode} plans with a model of the run and needs a "
            "planner: asyncrl train and asyncrl simulate give the simulator's "
            "(asyncrl.sim.planner.ModelPlanner); from Python pass Controller(planner=...), "
            "or use mode: aimd")
    else:
        pilot = PlannedAutopilot(cfg, retuner, planner, engines)
    retuner.ctx.stats.extras.append(pilot.metrics)
    return pilot


__all__ = ["PlanRequest", "PlanResult", "PlannedAutopilot", "Planner", "Prediction",
           "Setting", "build_autopilot"]
