"""The Ray backend's elastic fleet: ``asyncrl fleet RUN_DIR scale N`` starts or
drains rollout workers within ``cluster.rollout_workers: {min, max}`` (issue 35;
docs/fleet.md).

The controller's engine list never changes size: the backend builds ``max``
proxies, those above ``num_rollout_workers`` as vacant slots (no actor; not
healthy, so never picked while a worker is; weight syncs skip them).

* **join** (scale up, lowest vacant slot first): the slot starts an actor from
  the pool's newest weights and loads every version that arrived meanwhile -
  the restart path's catch-up - and only then turns healthy, so its first group
  starts at the version it holds.
* **leave** (scale down, highest working slot first, or ``remove "worker N"``):
  the worker takes no new group; its groups finish (up to the deadline) or, with
  ``abort`` or at the deadline, are aborted and continue elsewhere from their
  tokens (:class:`~asyncrl.errors.EngineLeft`); then the actor is stopped and
  the slot is vacant again.
* A worker that dies while the fleet is above ``min`` leaves the same way,
  without a restart (proxies.RayEngine._lost).
* A worker still **starting** (Ray may not be able to place it) is no one's
  to wait for: ``remove`` or a scale-down cancels its start (its pending actor
  is killed) instead of waiting behind it, and goes first in a scale-down. Each
  change marks its workers at once and waits outside any lock, so no command
  queues behind another's wait. Before starting workers, ``scale`` checks that
  the cluster can hold them (:mod:`asyncrl.cluster.placement`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Awaitable

from asyncrl._util.text import plural
from asyncrl.cluster.placement import Placement
from asyncrl.cluster.proxies import (
    ALIVE,
    DRAINING,
    LOST,
    RESTARTING,
    VACANT,
    RayEngine,
    WorkerPool,
    _future,
    _reason,
    kill_actor,
)
from asyncrl.engines.fleet import FleetMember, Health, tell
from asyncrl.errors import FleetError

log = logging.getLogger("asyncrl.cluster")

_HEALTH: dict[str, Health] = {ALIVE: "healthy", RESTARTING: "joining", DRAINING: "draining",
                              LOST: "gone"}


class RayFleet:
    """The :class:`~asyncrl.engines.fleet.ElasticFleet` of a run's rollout workers."""

    def __init__(self, pool: WorkerPool, *, min_size: int, max_size: int,
                 placement: Placement | None = None) -> None:
        self.pool, self.min_size, self.max_size = pool, min_size, max_size
        pool.fleet, pool.min_workers = self, min_size
        #: The cluster's resources against a worker's request (None: not checked).
        self.placement = placement
        #: Each slot's newest join and the loop time it began (``status`` says how long).
        self._joins: dict[int, tuple[asyncio.Task[None], float]] = {}

    def members(self) -> list[FleetMember]:
        starting = {i: since for i, (task, since) in self._joins.items() if not task.done()}
        now = asyncio.get_running_loop().time() if starting else 0.0
        return [FleetMember(f"worker {e.index}", e.weight_version, e.inflight, _HEALTH[e.state],
                            detail=(f"for {now - starting[e.index]:.0f}s"
                                    if e.state == RESTARTING and e.index in starting else ""))
                for e in self.pool.engines if e.state != VACANT]

    async def add(self, url: str) -> FleetMember:
        raise FleetError("the Ray backend's fleet is its rollout workers: change it with "
                         "asyncrl fleet RUN_DIR scale N")

    async def remove(self, name: str, *, abort: bool = False,
                     deadline_s: float | None = None) -> FleetMember:
        match = re.fullmatch(r"(?:worker\s*)?(\d+)", name.strip())
        engine = next((e for e in self.pool.serving()
                       if match and e.index == int(match.group(1))), None)
        if engine is None:
            names = ", ".join(f"worker {e.index}" for e in self.pool.serving()) or "none"
            raise FleetError(f"fleet remove: {name!r} is not a working rollout worker "
                             f"(working: {names})")
        self._check(len(self.pool.serving()) - 1)
        await self._leave(engine, abort=abort, deadline_s=deadline_s, why="fleet remove")
        return FleetMember(f"worker {engine.index}", engine.weight_version, 0, "gone")

    async def scale(self, size: int) -> list[FleetMember]:
        serving = self.pool.serving()
        self._check(size)
        need = max(size - len(serving), 0)
        vacant = [e for e in self.pool.engines if e.state == VACANT]
        if len(vacant) < need:
            # A slot still leaving (draining, or a cancelled start unwinding) is neither
            # serving nor vacant: scaling past it would start fewer than asked.
            leaving = [f"worker {e.index}" for e in self.pool.engines
                       if e.state != VACANT and e not in serving]
            raise FleetError(
                f"fleet scale {size}: {', '.join(leaving)} {'is' if len(leaving) == 1 else 'are'} "
                "still leaving the fleet, so its slot cannot start a worker yet; scale again "
                "once `asyncrl fleet RUN_DIR status` no longer lists it")
        vacant = vacant[:need]
        warning = (self.placement.check(len(vacant), len(serving))
                   if vacant and self.placement is not None else None)
        # Workers still starting leave first: they serve nothing yet, and may never start.
        surplus = sorted(serving, key=lambda e: (e.state != RESTARTING, -e.index))
        # Every worker is marked here, before anything awaits: a command that comes
        # meanwhile sees the fleet as this one leaves it.
        changes = [self._join(e, warning) for e in vacant] + [
            asyncio.ensure_future(self._leave(e, abort=False, deadline_s=None,
                                              why=f"fleet scale {size}"))
            for e in surplus[:max(len(serving) - size, 0)]]
        try:
            if changes:
                await asyncio.wait(changes)
        except asyncio.CancelledError:  # the run ends: so do the changes
            for change in changes:
                change.cancel()
            await asyncio.wait(changes)
            _errors(changes)  # read, so that none is reported as never retrieved
            raise
        # A join's task is cancelled by a later command (remove, a scale-down) or by
        # the engine's close (the run's end, or a Python caller closing the engines).
        cancelled = [str(e.index) for e, change in zip(vacant, changes) if change.cancelled()]
        errors = _errors(changes)
        if cancelled:
            working = sum(e.state == ALIVE for e in self.pool.engines)
            errors.insert(0, FleetError(
                f"{plural(len(cancelled), 'rollout worker')} did not join (worker "
                f"{', '.join(cancelled)}): its start was cancelled (by a later fleet command, "
                f"or the engines closing); {working} of {size} work"))
        if errors:
            raise errors[0]
        return self.members()

    def _join(self, engine: RayEngine, warning: str | None) -> asyncio.Task[None]:
        """Start a worker in the vacant slot ``engine``: marked joining now, healthy
        once it holds the newest weights (the task, which a removal cancels)."""
        engine.state = RESTARTING  # shown as joining; not picked
        engine.pool.changed.fire()
        task = asyncio.ensure_future(join(engine, self.placement, warning))
        # The slot's start, as a restart's is: closing the engine (the run's end) cancels it.
        engine._restart_task = task
        self._joins[engine.index] = (task, asyncio.get_running_loop().time())
        return task

    def _leave(self, engine: RayEngine, *, abort: bool, deadline_s: float | None,
               why: str) -> Awaitable[None]:
        """Take ``engine`` out of the fleet: a working one drains (:func:`leave`), a
        starting one's start is cancelled. Marked now; the awaitable ends when it is out."""
        if engine.state != RESTARTING:
            return leave(engine, abort=abort, deadline_s=deadline_s)
        start = engine._restart_task
        # Gone at once: not serving, and not vacant (so not started again) until
        # its start has unwound.
        engine.state = LOST
        engine.pool.changed.fire()
        if start is not None:
            start.cancel()  # the start kills its actor (placed or still pending)
        now = asyncio.get_running_loop().time()
        join, since = self._joins.get(engine.index, (None, now))
        since = since if join is start else now  # (a restart's start: not timed)

        async def vacate() -> None:
            if start is not None:
                await asyncio.wait([start])
            engine.state = VACANT
            engine.pool.changed.fire()
            log.warning("rollout worker %d: its start was cancelled by %s after %.0fs (its actor "
                        "is killed); the slot is vacant", engine.index, why,
                        asyncio.get_running_loop().time() - since)
        return vacate()

    def _check(self, size: int) -> None:
        if size < self.min_size:
            raise FleetError(f"the fleet would have {size} rollout workers, below "
                             f"cluster.rollout_workers.min={self.min_size}")
        if size > self.max_size:
            raise FleetError(f"the fleet would have {size} rollout workers, above "
                             f"cluster.rollout_workers.max={self.max_size}; raise it (the "
                             "backend keeps that many slots from the start)")


async def join(engine: RayEngine, placement: Placement | None, warning: str | None) -> None:
    """Start a worker in the slot ``engine`` (marked joining by the caller); healthy
    once it holds the newest weights. FleetError: it did not start."""
    timeout = f"cluster.actor_startup_timeout_s={engine.startup_timeout_s:g}s"
    numbers = f" ({placement.numbers()})" if placement is not None else ""
    line = (f"rollout worker {engine.index}: waiting for Ray to place it{numbers}"
            f"{'; ' + warning if warning else ''}. Up to {timeout}; "
            f"`asyncrl fleet RUN_DIR remove 'worker {engine.index}'` cancels it")
    tell(line)
    if warning:
        log.warning("%s", line)
    try:
        actor, info = await engine._start_incarnation()
    except asyncio.CancelledError:
        if engine.state == RESTARTING:  # the run ends (a removal vacates the slot itself)
            engine.state = VACANT
            engine.pool.changed.fire()
        raise
    except Exception as exc:
        engine.state = VACANT
        engine.pool.changed.fire()
        if isinstance(exc, asyncio.TimeoutError):  # not the builtin's subclass before 3.11
            numbers = f": {placement.numbers()}" if placement is not None else ""
            raise FleetError(
                f"rollout worker {engine.index} did not start within {timeout}{numbers}. If "
                "Ray could not place it: lower cluster.rollout_worker.num_cpus/num_gpus, add "
                "nodes, or scale to fewer; if building the model is slow, raise the timeout"
            ) from None
        raise FleetError(f"rollout worker {engine.index} did not start ({_reason(exc)}); "
                         "the worker's log (under Ray's logs) says why") from None
    # Nothing awaits between the last catch-up load and here (as for a restart).
    engine.actor, engine.pid, engine.node_id = actor, info["pid"], info["node_id"]
    engine._version = info["version"]
    engine.versions.append(info["loaded"])
    engine.state = ALIVE
    engine.pool.changed.fire()
    log.warning("rollout worker %d joined (pid %d) with weights of version %d",
                engine.index, engine.pid, engine._version)


def leave(engine: RayEngine, *, abort: bool, deadline_s: float | None) -> Awaitable[None]:
    """Drain ``engine``'s worker (see the module docstring), then stop it: marked
    draining now; the awaitable ends once the worker is stopped."""
    engine.state = DRAINING
    engine.pool.changed.fire()
    return _drain(engine, abort=abort, deadline_s=deadline_s)


async def _drain(engine: RayEngine, *, abort: bool, deadline_s: float | None) -> None:
    if engine.inflight and not abort:
        tell(f"rollout worker {engine.index}: draining; waiting for its "
             f"{plural(engine.inflight, 'group')} to finish"
             f"{f' (up to {deadline_s:g}s)' if deadline_s is not None else ''}")
    drained = asyncio.ensure_future(_idle(engine))
    try:
        if not abort:
            await asyncio.wait([drained], timeout=deadline_s)
        if not drained.done() and engine.state == DRAINING:
            engine.handover.update(engine.running)
            await engine.abort(list(engine.running))
            await drained
    finally:
        drained.cancel()
    actor = engine.actor
    closing = engine.state == DRAINING and actor is not None
    # Vacant before the worker closes: no weight load may reach an engine whose
    # executor is shutting down (a sync during the close once failed the run);
    # a load already on its way is dropped (RayEngine._load).
    engine.state = VACANT
    if closing:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_future(actor.close.remote()), timeout=30)
        kill_actor(actor)
    engine.pool.changed.fire()


def _errors(changes: list[asyncio.Future[None]]) -> list[BaseException]:
    return [e for c in changes if not c.cancelled() and (e := c.exception()) is not None]


async def _idle(engine: RayEngine) -> None:
    while engine.inflight and engine.state == DRAINING:
        await engine.pool.changed.wait()  # fired as each of its groups ends


__all__ = ["RayFleet", "join", "leave"]
