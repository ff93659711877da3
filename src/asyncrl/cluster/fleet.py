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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re

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
from asyncrl.engines.fleet import FleetMember, Health
from asyncrl.errors import FleetError

log = logging.getLogger("asyncrl.cluster")

_HEALTH: dict[str, Health] = {ALIVE: "healthy", RESTARTING: "joining", DRAINING: "draining",
                              LOST: "gone"}


class RayFleet:
    """The :class:`~asyncrl.engines.fleet.ElasticFleet` of a run's rollout workers."""

    def __init__(self, pool: WorkerPool, *, min_size: int, max_size: int) -> None:
        self.pool, self.min_size, self.max_size = pool, min_size, max_size
        pool.fleet, pool.min_workers = self, min_size
        self._changing = asyncio.Lock()

    def members(self) -> list[FleetMember]:
        return [FleetMember(f"worker {e.index}", e.weight_version, e.inflight, _HEALTH[e.state])
                for e in self.pool.engines if e.state != VACANT]

    async def add(self, url: str) -> FleetMember:
        raise FleetError("the Ray backend's fleet is its rollout workers: change it with "
                         "asyncrl fleet RUN_DIR scale N")

    async def remove(self, name: str, *, abort: bool = False,
                     deadline_s: float | None = None) -> FleetMember:
        async with self._changing:
            match = re.fullmatch(r"(?:worker\s*)?(\d+)", name.strip())
            engine = next((e for e in self.pool.serving()
                           if match and e.index == int(match.group(1))), None)
            if engine is None:
                names = ", ".join(f"worker {e.index}" for e in self.pool.serving()) or "none"
                raise FleetError(f"fleet remove: {name!r} is not a working rollout worker "
                                 f"(working: {names})")
            self._check(len(self.pool.serving()) - 1)
            await leave(engine, abort=abort, deadline_s=deadline_s)
            return FleetMember(f"worker {engine.index}", engine.weight_version, 0, "gone")

    async def scale(self, size: int) -> list[FleetMember]:
        async with self._changing:
            serving = self.pool.serving()
            self._check(size)
            vacant = [e for e in self.pool.engines if e.state == VACANT]
            await asyncio.gather(*(join(e) for e in vacant[:max(size - len(serving), 0)]))
            for engine in sorted(serving, key=lambda e: -e.index)[:max(len(serving) - size, 0)]:
                await leave(engine, abort=False, deadline_s=None)
            return self.members()

    def _check(self, size: int) -> None:
        if size < self.min_size:
            raise FleetError(f"the fleet would have {size} rollout workers, below "
                             f"cluster.rollout_workers.min={self.min_size}")
        if size > self.max_size:
            raise FleetError(f"the fleet would have {size} rollout workers, above "
                             f"cluster.rollout_workers.max={self.max_size}; raise it (the "
                             "backend keeps that many slots from the start)")


async def join(engine: RayEngine) -> None:
    """Start a worker in a vacant slot; healthy once it holds the newest weights."""
    engine.state = RESTARTING  # shown as joining; not picked
    engine.pool.changed.fire()
    try:
        actor, info = await engine._start_incarnation()
    except Exception as exc:
        engine.state = VACANT
        engine.pool.changed.fire()
        raise FleetError(f"rollout worker {engine.index} did not start ({_reason(exc)}); "
                         "the cluster may lack the resources cluster.rollout_worker asks "
                         "for") from None
    # Nothing awaits between the last catch-up load and here (as for a restart).
    engine.actor, engine.pid, engine.node_id = actor, info["pid"], info["node_id"]
    engine._version = info["version"]
    engine.versions.append(info["loaded"])
    engine.state = ALIVE
    engine.pool.changed.fire()
    log.warning("rollout worker %d joined (pid %d) with weights of version %d",
                engine.index, engine.pid, engine._version)


async def leave(engine: RayEngine, *, abort: bool, deadline_s: float | None) -> None:
    """Drain ``engine``'s worker (see the module docstring), then stop it."""
    engine.state = DRAINING
    engine.pool.changed.fire()
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


async def _idle(engine: RayEngine) -> None:
    while engine.inflight and engine.state == DRAINING:
        await engine.pool.changed.wait()  # fired as each of its groups ends


__all__ = ["RayFleet", "join", "leave"]
