"""``async_rl.autopilot``: decisions from the step records, applied through the
:class:`~asyncrl.controller.retune.Retuner` at step boundaries.

:class:`Autopilot` is what every mode shares - the cadence (a decision every
``replan_every_steps`` steps once ``warmup_steps`` steps of this run, or of
this resumed run, are done; none after ``freeze_after_steps``), the record
(:attr:`Autopilot.decisions`, the ``autopilot.jsonl`` journal, the
``autopilot/*`` numbers of every step record) and the state a checkpoint
keeps - and the ``aimd`` rule itself. The model-based modes are
:class:`asyncrl.controller.autoplan.PlannedAutopilot`.

``mode: aimd`` moves only the in-flight bound, as prime-rl's adaptive
concurrency does, but clocked by training steps and driven by what the
staleness contract costs rather than by KV-cache pressure:

* every ``replan_every_steps`` steps after ``warmup_steps``, read the window's
  step records: the trainer's idle fraction (``trainer_idle_s / step_time_s``),
  the waste fraction (evicted + aborted groups per group ended) and the p95
  of the trained groups' staleness;
* a broken bound (waste or staleness): **decrease** - the bound times
  ``decrease``, then a *drain latch*: no further move until the groups in
  flight have fallen to the new bound (a cut whose effect has not shown yet
  must not be cut again);
* else, a trainer idle above ``idle_high``: **increase** by ``increase`` groups;
* else hold. Always within ``[min_inflight, max_inflight]`` (default upper
  clamp: the buffer capacity, since each group in flight holds a slot).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl._util.bounded import KEEP
from asyncrl.config.autopilot import AutopilotConfig
from asyncrl.controller.retune import Retuner, Setting

log = logging.getLogger("asyncrl.controller")

#: Where a decision goes besides :attr:`Autopilot.decisions` (``asyncrl train``:
#: a line of ``autopilot.jsonl``).
Journal = Callable[[dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class WindowStats:
    """What a decision reads, over the last ``replan_every_steps`` step records."""

    idle_frac: float
    waste_frac: float
    staleness_p95: float
    inflight: int
    #: Groups trained per second of the window's steps.
    throughput: float = math.nan

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> WindowStats:
        step_s = sum(r["step_time_s"] for r in records) or 1e-12
        idle = sum(r["trainer_idle_s"] for r in records)
        wasted = sum(r["groups_evicted"] + r["groups_aborted"] for r in records)
        trained = sum(r["groups_trained"] for r in records)
        ended = wasted + trained
        hist: collections.Counter[int] = collections.Counter()
        for r in records:
            hist.update({int(k): n for k, n in r["staleness_hist"].items()})
        return cls(idle / step_s, wasted / ended if ended else 0.0, _p95(hist),
                   records[-1]["inflight"], trained / step_s)

    def keeps(self, cfg: AutopilotConfig) -> bool:
        """True when the window kept ``cfg.bounds``."""
        b = cfg.bounds
        return not ((b.max_waste_frac is not None and self.waste_frac > b.max_waste_frac)
                    or (b.max_staleness_p95 is not None
                        and self.staleness_p95 > b.max_staleness_p95))


def _p95(hist: collections.Counter[int]) -> float:
    total = sum(hist.values())
    if not total:
        return 0.0
    need, seen = math.ceil(0.95 * total), 0
    for value in sorted(hist):
        seen += hist[value]
        if seen >= need:
            return float(value)
    return float(max(hist))


class Autopilot:
    """The ``aimd`` mode, and the cadence, record and state every mode shares."""

    def __init__(self, cfg: AutopilotConfig, retuner: Retuner) -> None:
        self.cfg = cfg
        self.retuner = retuner
        #: The newest decisions (every one is in the journal).
        self.decisions: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEEP)
        self.journal: Journal | None = None
        #: Where the run's profile goes (``asyncrl train``: ``autopilot_profile.json``;
        #: asyncrl.controller.profile says when).
        self.on_profile: Journal | None = None
        #: The last model a plan fitted (the model-based modes), for the profile.
        self.model: dict[str, Any] | None = None
        #: Settings applied by this autopilot over the run (a resume keeps the count).
        self.changes = 0
        #: ``steps_done`` when this run (or this resumed run) began: the warm-up
        #: counts from there, since a resumed run starts cold again.
        self._start: int | None = None
        self._draining_to: int | None = None

    # ------------------------------------------------------------- cadence
    def after_step(self, steps_done: int, records: Sequence[dict[str, Any]]) -> None:
        """Called at every step boundary (before the retuner applies what is asked)."""
        if self._start is None:
            self._start = steps_done - 1
        cfg = self.cfg
        since = steps_done - self._start - cfg.warmup_steps
        if since <= 0 or self.frozen(steps_done):
            return
        self.at_boundary(steps_done, list(records), due=since % cfg.replan_every_steps == 0)

    def frozen(self, steps_done: int) -> bool:
        return self.cfg.freeze_after_steps is not None and steps_done > self.cfg.freeze_after_steps

    def at_boundary(self, steps_done: int, records: list[dict[str, Any]], *, due: bool) -> None:
        """A step boundary after the warm-up; ``due``: a decision is due now."""
        if not due:
            return
        cfg = self.cfg
        window = WindowStats.of(records[-cfg.replan_every_steps:])
        previous = self.retuner.target
        current = previous.max_inflight_prompts
        action, reason = self._decide(window, current)
        new = current if action == "hold" else self._clamp(self._move(action, current))
        if new != current:
            self.retuner.request(max_inflight_prompts=new)
            if action == "decrease":
                self._draining_to = new
        self.record({"step": steps_done, "action": action, "reason": reason,
                     "previous": previous.as_dict(),
                     "setting": dataclasses.replace(previous, max_inflight_prompts=new).as_dict(),
                     "measured": dataclasses.asdict(window),
                     # (the in-flight bound again, flat: what the aimd tests read)
                     "max_inflight_prompts": new, **dataclasses.asdict(window)},
                    changed=new != current)

    # -------------------------------------------------------------- record
    def record(self, decision: dict[str, Any], *, changed: bool) -> None:
        """Keep ``decision`` (and journal it); count it as a change if it asked for one."""
        decision = {"step": decision["step"], "mode": self.cfg.mode, **decision}
        self.changes += changed
        self.decisions.append(decision)
        if self.journal is not None:
            self.journal(decision)
        log.info("autopilot at step %d: %s (%s)%s", decision["step"], decision["action"],
                 decision["reason"], f" -> {decision['setting']}" if changed else "")

    def metrics(self) -> dict[str, float]:
        """``autopilot/*`` of a step record: the knobs in force during the step
        and the changes asked for so far."""
        now = self.retuner.current()
        out = {"autopilot/max_inflight_prompts": float(now.max_inflight_prompts),
               "autopilot/max_buffered_rollouts": float(now.max_buffered_rollouts),
               "autopilot/changes": float(self.changes)}
        if now.window is not None:
            out["autopilot/window"] = float(now.window)
        return out

    def summary(self) -> dict[str, Any]:
        """The summary's ``autopilot`` entry: the mode, how many changes, the final setting."""
        return {"mode": self.cfg.mode, "changes": self.changes, "decisions": len(self.decisions),
                "final": self.retuner.target.as_dict()}

    # ------------------------------------------------------ fleet and close
    def fleet_changed(self, rollout_slots: int) -> None:
        """The number of generation slots changed (the elastic fleet's hook): the
        measurements so far describe another fleet, so warm up again."""
        self._start = None

    def close(self) -> None:
        """The run ended: release what the mode holds (a planner's process)."""

    # --------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.cfg.mode, "changes": self.changes, "draining_to": self._draining_to}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the count of changes and the drain latch (the setting itself is
        the retuner's state; the warm-up starts again)."""
        self.changes = int(state.get("changes", 0))
        if state.get("mode") == self.cfg.mode:
            self._draining_to = state.get("draining_to")

    # ---------------------------------------------------------------- aimd
    def _decide(self, w: WindowStats, current: int) -> tuple[str, str]:
        bounds = self.cfg.bounds
        if self._draining_to is not None:
            if w.inflight > self._draining_to:
                return "hold", f"draining to {self._draining_to} ({w.inflight} in flight)"
            self._draining_to = None
        if bounds.max_waste_frac is not None and w.waste_frac > bounds.max_waste_frac:
            return "decrease", f"waste {w.waste_frac:.3f} > {bounds.max_waste_frac:g}"
        if bounds.max_staleness_p95 is not None and w.staleness_p95 > bounds.max_staleness_p95:
            return "decrease", f"staleness p95 {w.staleness_p95:g} > {bounds.max_staleness_p95:g}"
        if w.idle_frac > self.cfg.idle_high:
            return "increase", f"trainer idle {w.idle_frac:.3f} > {self.cfg.idle_high:g}"
        return "hold", "within bounds, trainer busy"

    def _move(self, action: str, current: int) -> int:
        if action == "increase":
            return current + self.cfg.increase
        if action == "decrease":
            return math.floor(current * self.cfg.decrease)
        return current

    def _clamp(self, value: int) -> int:
        cfg = self.cfg
        upper = cfg.max_inflight or self.retuner.target.max_buffered_rollouts
        return max(cfg.min_inflight, min(value, max(upper, cfg.min_inflight)))


__all__ = ["Autopilot", "Journal", "Setting", "WindowStats"]
