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
concurrency does, clocked by training steps and driven by what the staleness
contract costs and, where the engines report it, by their load
(:class:`~asyncrl.engines.ReportsPressure`: vLLM and the simulator do):

* every ``replan_every_steps`` steps after ``warmup_steps``, read the window's
  step records - the trainer's idle fraction (``trainer_idle_s /
  step_time_s``), the waste fraction (evicted + aborted groups per group
  ended), the p95 of the trained groups' staleness - and the engines' pressure
  now (requests running and waiting, KV-cache usage - where the engine can, the
  highest since the last decision - and preemptions so far);
* a broken bound (waste or staleness): **decrease** - the bound times
  ``decrease``, then a *drain latch*: no further move until the groups in
  flight have fallen to the new bound (a cut whose effect has not shown yet
  must not be cut again). Bounds are constraints: they come first;
* else, preemptions since the last decision (the engine ran out of KV cache and
  recomputes): **decrease** the same way (a cut);
* else, KV-cache usage above ``kv_high``: **decrease** by ``trim`` (a trim:
  the engine is full, not failing), with the same latch;
* else, a trainer idle above ``idle_high``: **increase** by ``increase``
  groups - or, while the KV-cache usage is below ``kv_low`` (room to spare),
  by the factor ``grow_factor`` when that is more;
* else hold. Always within ``[min_inflight, max_inflight]`` (default upper
  clamp: the buffer capacity, since each group in flight holds a slot).

Engines that report nothing (or ``engine_signals: false``) leave the broken
bound, the increase by ``increase`` groups and the hold: the step records
alone, as before engine signals.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl._util.bounded import KEEP
from asyncrl.config.autopilot import AutopilotConfig
from asyncrl.controller.retune import Retuner, Setting
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import EngineCapabilities, EnginePressure

log = logging.getLogger("asyncrl.controller")

#: Where a decision goes besides :attr:`Autopilot.decisions` (``asyncrl train``:
#: a line of ``autopilot.jsonl``).
#: Seconds an engine's ``pressure()`` may take before the decision goes without it.
PRESSURE_TIMEOUT_S = 10.0

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
        #: The engines' preemption counter at the last decision and how many
        #: engines it summed (None: none read yet).
        self._preemptions: tuple[int, int] | None = None
        #: The bound a cut or trim left: growth by ``grow_factor`` stops there
        #: (above it, additive only), so a cut and a growth do not alternate.
        self._grow_limit: int | None = None

    # ------------------------------------------------------------- cadence
    def after_step(self, steps_done: int, records: Sequence[dict[str, Any]], *,
                   pressure: EnginePressure | None = None) -> None:
        """Called at every step boundary (before the retuner applies what is asked),
        with the engines' pressure when :meth:`wants_pressure` said so."""
        if self._start is None:
            self._start = steps_done - 1
        since = self._since(steps_done)
        if since <= 0 or self.frozen(steps_done):
            return
        self.at_boundary(steps_done, list(records),
                         due=since % self.cfg.replan_every_steps == 0, pressure=pressure)

    def wants_pressure(self, steps_done: int) -> bool:
        """Asked by the controller just before :meth:`after_step`: whether this
        boundary's decision reads the engines' pressure (aimd, a decision due,
        ``engine_signals`` on) - the read waits on the engines, so only then."""
        cfg = self.cfg
        since = self._since(steps_done)
        return (cfg.mode == "aimd" and cfg.engine_signals and since > 0
                and not self.frozen(steps_done) and since % cfg.replan_every_steps == 0)

    def _since(self, steps_done: int) -> int:
        """Steps past the warm-up (a run's first boundary starts the count)."""
        start = steps_done - 1 if self._start is None else self._start
        return steps_done - start - self.cfg.warmup_steps

    def frozen(self, steps_done: int) -> bool:
        return self.cfg.freeze_after_steps is not None and steps_done > self.cfg.freeze_after_steps

    def at_boundary(self, steps_done: int, records: list[dict[str, Any]], *, due: bool,
                    pressure: EnginePressure | None = None) -> None:
        """A step boundary after the warm-up; ``due``: a decision is due now."""
        if not due:
            return
        cfg = self.cfg
        window = WindowStats.of(records[-cfg.replan_every_steps:])
        previous = self.retuner.target
        current = previous.max_inflight_prompts
        action, reason, proposed = self._decide(window, current, pressure)
        new = current if action == "hold" else self._clamp(proposed)
        if action != "hold" and new != proposed:  # the clamp decided: say so, by direction
            action = "increase" if new > current else "decrease" if new < current else "hold"
            reason += (f"; clamped to {new} (min_inflight / max_inflight, by default the "
                       "buffer capacity)")
        if new != current:
            self.retuner.request(max_inflight_prompts=new)
            if action == "decrease":
                self._draining_to = self._grow_limit = new
        self.record({"step": steps_done, "action": action, "reason": reason,
                     "previous": previous.as_dict(),
                     "setting": dataclasses.replace(previous, max_inflight_prompts=new).as_dict(),
                     "measured": dataclasses.asdict(window),
                     "pressure": None if pressure is None else dataclasses.asdict(pressure),
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
        measurements so far describe another fleet, so warm up again (and count
        preemptions afresh: the engines that count them changed)."""
        self._start = None
        self._preemptions = self._grow_limit = None

    def close(self) -> None:
        """The run ended: release what the mode holds (a planner's process)."""

    # --------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {"mode": self.cfg.mode, "changes": self.changes, "draining_to": self._draining_to,
                "grow_limit": self._grow_limit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: the count of changes and the drain latch (the setting itself is
        the retuner's state; the warm-up starts again)."""
        self.changes = int(state.get("changes", 0))
        if state.get("mode") == self.cfg.mode:
            self._draining_to = state.get("draining_to")
            self._grow_limit = state.get("grow_limit")

    # ---------------------------------------------------------------- aimd
    def _decide(self, w: WindowStats, current: int,
                p: EnginePressure | None) -> tuple[str, str, int]:
        """(action, reason, the bound asked for before clamping): the rules of
        the module docstring, in their order."""
        cfg, bounds = self.cfg, self.cfg.bounds
        preempted = self._new_preemptions(p)  # read at every decision: the baseline moves
        if self._draining_to is not None:
            if w.inflight > self._draining_to:
                return "hold", f"draining to {self._draining_to} ({w.inflight} in flight)", current
            self._draining_to = None
        cut = math.floor(current * cfg.decrease)
        if bounds.max_waste_frac is not None and w.waste_frac > bounds.max_waste_frac:
            return "decrease", f"waste {w.waste_frac:.3f} > {bounds.max_waste_frac:g}", cut
        if bounds.max_staleness_p95 is not None and w.staleness_p95 > bounds.max_staleness_p95:
            return ("decrease", f"staleness p95 {w.staleness_p95:g} > "
                    f"{bounds.max_staleness_p95:g}", cut)
        if preempted:
            return "decrease", f"{preempted} preemptions since the last decision", cut
        kv = p.kv_cache_usage if p is not None else None
        if kv is not None and kv > cfg.kv_high:
            return ("decrease", f"KV cache {kv:.3f} > kv_high {cfg.kv_high:g}",
                    math.floor(current * cfg.trim))
        if w.idle_frac > cfg.idle_high:
            idle = f"trainer idle {w.idle_frac:.3f} > {cfg.idle_high:g}"
            limit = self._grow_limit
            if kv is not None and kv < cfg.kv_low and (limit is None or current < limit):
                grown = math.ceil(current * cfg.grow_factor)
                return ("increase", f"{idle}, KV cache {kv:.3f} < kv_low {cfg.kv_low:g}",
                        max(current + cfg.increase, grown if limit is None else min(grown, limit)))
            return "increase", idle + _kv_note(kv), current + cfg.increase
        return "hold", "within bounds, trainer busy" + _kv_note(kv), current

    def _new_preemptions(self, p: EnginePressure | None) -> int:
        """Preemptions since the last decision that read them (0 the first time,
        when the counter went back - an engine restarted - and when another set
        of engines answered: one that missed a read brings its whole count back)."""
        if p is None:
            return 0
        before, self._preemptions = self._preemptions, (p.preemptions, p.sources)
        if before is None or before[1] != p.sources:  # another set of engines: a new baseline
            return 0
        return max(0, p.preemptions - before[0])

    def _clamp(self, value: int) -> int:
        cfg = self.cfg
        upper = cfg.max_inflight or self.retuner.target.max_buffered_rollouts
        return max(cfg.min_inflight, min(value, max(upper, cfg.min_inflight)))


def _kv_note(kv: float | None) -> str:
    return "" if kv is None else f", KV cache {kv:.3f}"


async def read_pressure(engines: Sequence[RolloutEngine],
                        capabilities: Sequence[EngineCapabilities]) -> EnginePressure | None:
    """The engines' pressure as one (:meth:`EnginePressure.combine`), from those
    that report it; None when none does. An engine whose report fails counts
    as one that reports nothing this time (logged): the autopilot advises, it
    must not stop the run."""
    async def one(engine: RolloutEngine) -> EnginePressure | None:
        try:
            return await asyncio.wait_for(engine.pressure(),  # type: ignore[attr-defined]
                                          PRESSURE_TIMEOUT_S)
        except Exception as exc:  # (a timeout too: the train pump waits for it)
            log.warning("autopilot: %s.pressure() failed (%r); deciding without it",
                        type(engine).__name__, exc)
            return None

    reporting = [e for e, c in zip(engines, capabilities) if c.pressure]
    if not reporting:
        return None
    return EnginePressure.combine(await asyncio.gather(*(one(e) for e in reporting)))


__all__ = ["Autopilot", "Journal", "Setting", "WindowStats", "read_pressure"]
