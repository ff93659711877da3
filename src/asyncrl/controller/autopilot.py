"""``async_rl.autopilot``: decisions from the step records, applied through the
:class:`~asyncrl.controller.retune.Retuner` at step boundaries.

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
from collections.abc import Sequence
from typing import Any

from asyncrl.config.autopilot import AutopilotConfig
from asyncrl.controller.retune import Retuner

log = logging.getLogger("asyncrl.controller")


@dataclasses.dataclass(frozen=True)
class WindowStats:
    """What a decision reads, over the last ``replan_every_steps`` step records."""

    idle_frac: float
    waste_frac: float
    staleness_p95: float
    inflight: int

    @classmethod
    def of(cls, records: Sequence[dict[str, Any]]) -> WindowStats:
        step_s = sum(r["step_time_s"] for r in records) or 1e-12
        idle = sum(r["trainer_idle_s"] for r in records)
        wasted = sum(r["groups_evicted"] + r["groups_aborted"] for r in records)
        ended = wasted + sum(r["groups_trained"] for r in records)
        hist: collections.Counter[int] = collections.Counter()
        for r in records:
            hist.update({int(k): n for k, n in r["staleness_hist"].items()})
        return cls(idle / step_s, wasted / ended if ended else 0.0, _p95(hist),
                   records[-1]["inflight"])


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
    """One decision every ``replan_every_steps`` steps; :attr:`decisions` keeps them."""

    def __init__(self, cfg: AutopilotConfig, retuner: Retuner) -> None:
        self.cfg = cfg
        self.retuner = retuner
        self.decisions: list[dict[str, Any]] = []
        self._draining_to: int | None = None

    def after_step(self, steps_done: int, records: Sequence[dict[str, Any]]) -> None:
        """Called at every step boundary (before the retuner applies what is asked)."""
        cfg = self.cfg
        if steps_done <= cfg.warmup_steps or (steps_done - cfg.warmup_steps) % cfg.replan_every_steps:
            return
        if cfg.freeze_after_steps is not None and steps_done > cfg.freeze_after_steps:
            return
        window = WindowStats.of(list(records)[-cfg.replan_every_steps:])
        current = self.retuner.target.max_inflight_prompts
        action, reason = self._decide(window, current)
        new = current if action == "hold" else self._clamp(self._move(action, current))
        if new != current:
            self.retuner.request(max_inflight_prompts=new)
            if action == "decrease":
                self._draining_to = new
        self.decisions.append({"step": steps_done, "mode": cfg.mode, "action": action,
                               "reason": reason, "previous": current, "max_inflight_prompts": new,
                               **dataclasses.asdict(window)})
        log.debug("autopilot at step %d: %s (%s), in-flight bound %d -> %d", steps_done,
                  action, reason, current, new)

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
