"""An engine whose fleet can change while the run goes on (issue 35, docs/fleet.md).

An engine that drives several servers or workers behind one
:class:`~asyncrl.engines.RolloutEngine` (``vllm_server``) exposes them as an
:class:`ElasticFleet` in its ``fleet`` attribute (the :class:`HasFleet`
capability). ``asyncrl fleet RUN_DIR ...`` reaches it through the run's control
channel (:mod:`asyncrl.run.fleet_channel`) and the controller
(:class:`asyncrl.controller.fleet.FleetControl`).

The contract every implementation keeps:

* **joining**: a member is picked for a group only once it holds the engine's
  newest weights (loaded before its first group, again if a sync happened
  meanwhile), so the group's start weight is the version it loaded;
* **leaving**: ``remove`` drains. The member takes no new group; its groups in
  flight finish (default, up to ``deadline_s``) or, with ``abort`` (or at the
  deadline), are aborted with their tokens and raise
  :class:`~asyncrl.errors.EngineLeft` carrying them, which the controller
  continues elsewhere from that prefix;
* a bad command raises :class:`~asyncrl.errors.FleetError` (one line, the run
  unaffected);
* a command that waits (a member starting, a drain) says what it waits for
  with :func:`tell`, which the command's client prints as it comes.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable
from typing import Literal, Protocol, runtime_checkable

#: A member's health as ``asyncrl fleet status`` prints it.
Health = Literal["joining", "healthy", "draining", "gone"]


@dataclasses.dataclass(frozen=True)
class FleetMember:
    """One server or worker of a fleet, as ``status`` shows it."""

    name: str  # its URL, or "worker N"
    version: int  # the weight version it holds
    inflight: int  # groups it generates now
    health: Health
    #: Groups it can generate at once, at least: its share of the fleet's
    #: generation slots (the simulator's slots; 1 for a server or worker, which
    #: takes one group at the least - its real batch capacity is not counted).
    slots: int = 1
    #: Said after the health in ``status`` (e.g. how long it has been joining).
    detail: str = ""


@runtime_checkable
class ElasticFleet(Protocol):
    #: The fewest and most members ``scale`` and ``remove`` may leave.
    min_size: int
    max_size: int

    def members(self) -> list[FleetMember]:
        """Called by ``status`` and after every change: the members now (gone ones too)."""
        ...

    async def add(self, url: str) -> FleetMember:
        """Called by ``fleet add URL``: connect to a running server, bring it to the
        newest weights, then let it take groups. FleetError: not a usable server."""
        ...

    async def remove(self, name: str, *, abort: bool = False,
                     deadline_s: float | None = None) -> FleetMember:
        """Called by ``fleet remove``: drain ``name`` (see the module docstring);
        returns once it holds no group."""
        ...

    async def scale(self, size: int) -> list[FleetMember]:
        """Called by ``fleet scale N``: start members (or drain the newest ones) until
        ``size`` serve. FleetError: outside ``[min_size, max_size]``."""
        ...


@runtime_checkable
class HasFleet(Protocol):
    @property
    def fleet(self) -> ElasticFleet:
        """Read once when the controller is handed the engine: its changeable fleet."""
        ...


#: Where :func:`tell` sends a line: set by the run's control channel for the
#: length of each command (a context variable, so every task the command starts
#: inherits it); None: no client listens.
progress: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar(
    "asyncrl_fleet_progress", default=None)


def tell(line: str) -> None:
    """Tell the client of the fleet command being carried out ``line`` now
    (what it waits for), before its answer."""
    say = progress.get()
    if say is not None:
        say(line)


def fleet_slots(members: list[FleetMember]) -> int:
    """Generation slots of the members that take groups (joining and draining
    ones do not)."""
    return sum(m.slots for m in members if m.health == "healthy")


__all__ = ["ElasticFleet", "FleetMember", "HasFleet", "Health", "fleet_slots", "progress",
           "tell"]
