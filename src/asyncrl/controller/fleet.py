"""The controller's side of ``asyncrl fleet`` (issue 35, docs/fleet.md).

:class:`FleetControl` answers the commands the run's control channel
(:mod:`asyncrl.run.fleet_channel`) hands it: ``status`` lists every engine (the
members of an engine with an :class:`~asyncrl.engines.fleet.ElasticFleet`, one
row for any other), ``add`` / ``remove`` / ``scale`` go to the engine whose fleet
can change. After every change the facts that depend on the number of
generation slots are checked again (:meth:`FleetControl.fleet_changed`) and the
``on_change`` hooks are called with the new slot count: that is the event the
autopilot re-plans on.

A command that cannot be carried out raises :class:`~asyncrl.errors.FleetError`
before anything changed; the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.controller.context import RunContext
from asyncrl.controller.validation import check_derived_facts
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.engines.fleet import ElasticFleet, FleetMember, fleet_slots
from asyncrl.errors import FleetError

log = logging.getLogger("asyncrl.controller")

#: Seconds ``remove`` lets an engine's groups finish before it aborts them
#: with their tokens (which then continue elsewhere).
DEFAULT_DRAIN_DEADLINE_S = 300.0

#: The commands and the arguments each takes.
COMMANDS = ("status", "add", "remove", "scale")


class FleetControl:
    """Carries out fleet commands against the run's engines."""

    def __init__(self, ctx: RunContext, engines: Sequence[RolloutEngine],
                 capabilities: Sequence[EngineCapabilities], load: Callable[[int], int],
                 inflight_bound: Callable[[], int]) -> None:
        self.ctx = ctx
        self.engines = list(engines)
        self.capabilities = list(capabilities)
        self._load = load
        self._inflight_bound = inflight_bound
        #: The elastic fleet of each engine that has one, by index (read once, like
        #: every capability); engines may share one (the Ray workers' proxies do).
        self.fleets: dict[int, ElasticFleet] = {
            i: e.fleet for i, (e, c) in enumerate(zip(self.engines, self.capabilities))  # type: ignore[attr-defined]
            if c.fleet}
        self._unique = list({id(f): f for f in self.fleets.values()}.values())
        #: Called with the fleet's generation slots after every change (the autopilot's event).
        self.on_change: list[Callable[[int], None]] = []

    # ------------------------------------------------------------ reading
    def rows(self) -> list[FleetMember]:
        """Every engine's members (a fixed engine is one row)."""
        out: list[FleetMember] = [m for f in self._unique for m in f.members()]
        for i, engine in enumerate(self.engines):
            if i in self.fleets:
                continue
            healthy = not self.capabilities[i].healthy or engine.healthy  # type: ignore[attr-defined]
            out.append(FleetMember(f"engine {i} ({type(engine).__name__})", engine.weight_version,
                                   self._load(i), "healthy" if healthy else "gone"))
        return out

    def slots(self) -> int:
        return sum(fleet_slots(f.members()) for f in self._unique)

    # ------------------------------------------------------------ commands
    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        """One command from the channel; the answer's ``lines`` are printed as they are."""
        op = request.get("op")
        if op not in COMMANDS:
            raise FleetError(f"unknown fleet command {op!r}; use one of {', '.join(COMMANDS)}")
        notes: list[str] = []
        if op != "status":
            fleet = self._elastic()
            try:
                notes.extend(await self._change(fleet, op, request))
            except Exception:
                # A command that failed part-way (one join of several timed out, a
                # start cancelled) may still have changed the fleet: the hooks hear of it.
                # (Not on cancellation: the run is ending, nothing re-plans.)
                self.fleet_changed()
                raise
            notes.extend(self.fleet_changed())
        return {"ok": True, "lines": [*format_rows(self.rows(), self.ctx.version.value), *notes]}

    @staticmethod
    async def _change(fleet: ElasticFleet, op: str, request: dict[str, Any]) -> list[str]:
        """Carry out ``add``, ``remove`` or ``scale``; the line saying what changed."""
        if op == "add":
            member = await fleet.add(str(request["url"]))
            return [f"added {member.name} at weight version {member.version}"]
        if op == "remove":
            deadline = request.get("deadline_s")
            member = await fleet.remove(
                str(request["url"]), abort=bool(request.get("abort")),
                deadline_s=DEFAULT_DRAIN_DEADLINE_S if deadline is None else float(deadline))
            return [f"removed {member.name}"]
        await fleet.scale(_size(request.get("size")))
        return [f"scaled to {request['size']}"]

    def fleet_changed(self, slots: int | None = None) -> list[str]:
        """Check the slot-dependent facts again and tell the hooks; the notes say
        what the new fleet means for the run's settings. ``slots``: the fleet's
        generation slots now (None: counted from the elastic engines; the
        simulator passes its own)."""
        check_derived_facts(self.ctx.sampler, self.ctx.grpo)  # a sampler may read the fleet
        slots = self.slots() if slots is None else slots
        bound = self._inflight_bound()
        notes = []
        if slots > bound:
            notes.append(f"note: async_rl.max_inflight_prompts={bound} is below the fleet's "
                         f"{slots} generation slots: {slots - bound} stay idle; raise it with "
                         "a re-tune (or let the autopilot) to use them")
        for line in notes:
            log.warning("%s", line)
        for hook in self.on_change:
            hook(slots)
        return notes

    def _elastic(self) -> ElasticFleet:
        if not self.fleets:
            names = ", ".join(sorted({type(e).__name__ for e in self.engines}))
            raise FleetError(
                f"this run's engines ({names}) have a fixed fleet: asyncrl fleet changes the "
                "servers of policy.engine: vllm_server, and the rollout workers of "
                "cluster.backend: ray with cluster.rollout_workers: {min, max} set")
        return self._unique[0]


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise FleetError(f"fleet scale: N must be a whole number >= 0, got {value!r}")
    return value


def format_rows(rows: Sequence[FleetMember], trainer_version: int) -> list[str]:
    """``status``'s table: one line per member."""
    width = max([len(r.name) for r in rows] + [6])
    lines = [f"trainer version {trainer_version}",
             f"{'engine':<{width}}  {'version':>7}  {'in flight':>9}  health"]
    lines += [f"{r.name:<{width}}  {r.version:>7}  {r.inflight:>9}  {r.health}"
              f"{' ' + r.detail if r.detail else ''}" for r in rows]
    return lines


__all__ = ["COMMANDS", "DEFAULT_DRAIN_DEADLINE_S", "FleetControl", "format_rows"]
