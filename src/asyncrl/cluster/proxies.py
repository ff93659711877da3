"""Driver-side proxies: the controller's engines and trainer, backed by Ray actors.

Each proxy implements the :class:`~asyncrl.engines.RolloutEngine` or
:class:`~asyncrl.trainers.Trainer` protocol by calling an actor method and
awaiting the ObjectRef it returns (ObjectRefs are awaitable), so the controller
stays one asyncio program and never blocks on Ray.

Weight sync: ``RayTrainer.get_weights`` returns an ObjectRef to the weights the
trainer actor just returned - one copy in the object store per version - and
every ``RayEngine.update_weights`` passes that same ref on to its actor, which
Ray resolves on the worker's node. The driver never holds the tensors.

Errors of ``generate`` are classified here (docs/controller.md): the worker's
own error comes back as it was raised there (a ``RayTaskError`` that is also
an instance of the original class, so a typed infra/data failure keeps its
kind and anything else stays a bug); any other Ray error (an object or its
owner lost, a system error) is a transport failure, infra.

Worker loss: a ``RayActorError`` from any call marks the worker lost. Its
pending ``generate`` calls raise :class:`~asyncrl.errors.EngineUnavailable`, so
the controller retries those groups elsewhere without charging their failure
budget, and ``healthy`` turns False so no new group is sent to it. The proxy
then starts a new actor from the newest weights (at most
``cluster.max_worker_restarts`` times per worker), and the worker takes groups
again only once it holds the newest version. A worker with no restarts left is
gone for good; when no worker is left, the run fails with
:class:`~asyncrl.errors.RolloutWorkersLost`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl._util import supervision
from asyncrl._util.bounded import append_bounded
from asyncrl._util.change_signal import ChangeSignal
from asyncrl.engines.capabilities import EngineCapabilities, EnginePressure
from asyncrl.errors import (
    EngineLeft,
    EngineUnavailable,
    GenerationError,
    RolloutWorkersLost,
    TrainerLost,
    require,
)
from asyncrl.types import GenerationRequest, GroupAborted, GroupId, GroupResult, Rollout

ray = require("ray", "ray", "cluster.backend: ray")
from ray.exceptions import RayActorError, RayError, RayTaskError  # noqa: E402

log = logging.getLogger("asyncrl.cluster")

ALIVE, RESTARTING, LOST = "alive", "restarting", "lost"
#: A slot of the elastic fleet with no worker now (scaled down, or its node left
#: above ``cluster.rollout_workers.min``), and a worker leaving it
#: (:mod:`asyncrl.cluster.fleet`): neither takes new groups.
VACANT, DRAINING = "vacant", "draining"
#: The states with a worker that holds weights and may have groups in flight.
_WORKING = (ALIVE, DRAINING)

#: Wait before retrying a failed worker restart; doubles up to the maximum.
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0

#: ``spawn(index, incarnation, weights_ref, version) -> actor handle``
Spawn = Callable[[int, int, Any, int], Any]

_RESUME_HINT = (
    "Resume from the last checkpoint with `asyncrl train --resume RUN_DIR` "
    "(checkpoints are written when checkpoint.every_steps > 0)"
)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _future(ref: Any) -> asyncio.Future[Any]:
    """An ObjectRef as an asyncio future (what ``asyncio.wait_for`` needs)."""
    return asyncio.wrap_future(ref.future())


def kill_actor(actor: Any) -> None:
    """Kill an actor for good; it may be dead already. Without a Ray instance
    (shut down meanwhile) there is nothing left to kill, and ``ray.kill`` would
    start a new local one."""
    if not ray.is_initialized():
        return
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


class WorkerPool:
    """What the rollout workers of one run share: the newest weights (to start
    a restarted worker from) and a signal fired whenever a worker changes state."""

    def __init__(self, weights: Any, version: int) -> None:
        self.engines: list[RayEngine] = []
        self.weights = weights
        self.version = version
        self.changed = ChangeSignal()
        self._offered: Any = weights
        #: The elastic fleet over these workers (asyncrl.cluster.fleet), and the
        #: fewest workers it keeps: above them a lost worker is not restarted.
        self.fleet: Any = None
        self.min_workers = 0

    def offer(self, weights: Any, version: int) -> Any:
        """Record ``weights`` as the newest and return the ref every worker loads.

        The controller hands every engine the same object per version, so plain
        weights (not yet an ObjectRef) are put in the object store only once.
        """
        if version < self.version:
            raise ValueError(
                f"weight version must not go back (the workers hold {self.version}, "
                f"got {version})"
            )
        if weights is not self._offered:
            self._offered = weights
            self.weights = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
            self.version = version
        return self.weights

    def any_healthy(self) -> bool:
        return any(e.state == ALIVE for e in self.engines)

    def any_left(self) -> bool:
        return any(e.state in (ALIVE, RESTARTING, DRAINING) for e in self.engines)

    def serving(self) -> list[RayEngine]:
        """Workers that take groups or will once started."""
        return [e for e in self.engines if e.state in (ALIVE, RESTARTING)]

    def all_lost_error(self) -> RolloutWorkersLost:
        restarts = ", ".join(f"worker {e.index}: {e.restarts}" for e in self.engines)
        return RolloutWorkersLost(
            f"every rollout worker died and none has a restart left (restarts used: {restarts}; "
            f"cluster.max_worker_restarts={self.engines[0].max_restarts if self.engines else 0}). "
            f"Check the workers' logs (out of memory?), raise cluster.max_worker_restarts or "
            f"add workers. {_RESUME_HINT}"
        )


_BUILT_IN = {"abort": True, "snapshot": True, "invalidate_cache": True}


class RayEngine:
    """A :class:`~asyncrl.engines.RolloutEngine` whose work runs in a Ray actor
    (an :class:`~asyncrl.cluster.actors.EngineWorker`)."""

    def __init__(
        self,
        pool: WorkerPool,
        index: int,
        spawn: Spawn,
        actor: Any,
        info: dict[str, Any] | None,
        *,
        max_restarts: int,
        startup_timeout_s: float,
    ) -> None:
        self.pool = pool
        self.index = index
        self.max_restarts = max_restarts
        self.startup_timeout_s = startup_timeout_s
        self._spawn = spawn
        self.actor = actor
        # No actor: a vacant slot of the elastic fleet (scaled up into later).
        self.state = ALIVE if actor is not None else VACANT
        info = info or {"pid": 0, "node_id": "", "version": pool.version}
        self.restarts = 0
        #: Actors this slot has started (each samples with a seed of its own).
        self.incarnations = 1 if actor is not None else 0
        #: Groups on the worker now; those in ``handover`` raise EngineLeft when aborted.
        self.running: set[GroupId] = set()
        self.handover: set[GroupId] = set()
        self.pid: int = info["pid"]
        self.node_id: str = info["node_id"]
        self._version: int = info["version"]
        # The worker's engine's optional members, declared (the controller reads
        # them once); health is the proxy's own, and weights go through Ray.
        # (A worker that does not say: the built-in engines' abort, snapshot and
        # cache invalidation.)
        worker = info.get("capabilities") or _BUILT_IN
        self.capabilities = dataclasses.replace(
            EngineCapabilities(**worker), healthy=True, device=False,
            fleet=pool.fleet is not None)
        #: The versions a worker acknowledged loading, one list per incarnation (the
        #: newest ones of a long run: bounded).
        self.versions: list[list[int]] = [[self._version]]
        #: Group ids whose attempt on this worker was lost when it died (the newest).
        self.lost_groups: list[GroupId] = []
        #: generate calls waiting on the worker now.
        self.inflight = 0
        #: Starting this slot's next actor: a restart, or a join (asyncrl.cluster.fleet).
        self._restart_task: asyncio.Task[None] | None = None
        self._closed = False
        pool.engines.append(self)

    # ------------------------------------------------------------ protocol
    @property
    def healthy(self) -> bool:
        """False while the worker is restarting or gone: the controller then
        sends its groups elsewhere."""
        return self.state == ALIVE

    @property
    def weight_version(self) -> int:
        return self._version

    @property
    def fleet(self) -> Any:
        """The elastic fleet of the run's workers (asyncrl.cluster.fleet.RayFleet)."""
        return self.pool.fleet

    async def generate(self, request: GenerationRequest) -> GroupResult:
        actor = await self._usable()
        gid = request.group_id
        ref = actor.generate.remote(request)
        self.inflight += 1
        self.running.add(gid)
        try:
            return await ref
        except GroupAborted as exc:  # (a RayTaskError that is also the worker's GroupAborted)
            if gid not in self.handover:
                raise
            self.handover.discard(gid)  # the worker leaves: continue elsewhere from its tokens
            raise EngineLeft(f"rollout worker {self.index} left the fleet",
                             partial=exc.partial) from None
        except asyncio.CancelledError:
            # The controller gave up on the group: stop the worker spending compute on it.
            with contextlib.suppress(Exception):
                ray.cancel(ref)
            raise
        except RayActorError as exc:
            append_bounded(self.lost_groups, request.group_id)
            self._lost(actor, exc)
            raise EngineUnavailable(
                f"rollout worker {self.index} died while generating group "
                f"{request.group_id!r} ({_reason(exc)})"
            ) from exc
        except RayTaskError:
            raise  # the worker's own error: classified (or a bug) where it was raised
        except RayError as exc:
            raise GenerationError(
                f"rollout worker {self.index}: Ray failed to return group "
                f"{request.group_id!r} ({type(exc).__name__}: {_reason(exc)})"
            ) from exc
        finally:
            self.inflight -= 1
            self.running.discard(gid)
            if self.state == DRAINING and not self.inflight:
                self.pool.changed.fire()  # a drain waits for this

    async def update_weights(self, weights: Any, version: int) -> None:
        ref = self.pool.offer(weights, version)
        if self.state in _WORKING:
            await self._load(self.actor, ref, version)
        elif self.state == LOST and not self.pool.any_left():
            raise self.pool.all_lost_error()
        # RESTARTING: the restart loads the newest weights before taking groups
        # (a joining worker too); VACANT: nothing to load.

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        if self.state in _WORKING and group_ids:
            await self._call(self.actor, "abort", list(group_ids))

    async def snapshot(self, group_ids: Sequence[GroupId]) -> dict[GroupId, GroupResult]:
        """The tokens the worker's groups have so far (nothing from a worker that
        is not alive: its groups are retried from their prefix)."""
        if self.state not in _WORKING or not group_ids:
            return {}
        return await self._call(self.actor, "snapshot", list(group_ids)) or {}

    async def invalidate_cache(self) -> None:
        # A restarting worker builds its caches from scratch anyway.
        if self.state in _WORKING:
            await self._call(self.actor, "invalidate_cache")

    async def pressure(self) -> EnginePressure | None:
        """The worker's engine's load (declared only where that engine reports
        it); None from a worker that is not working."""
        if self.state not in _WORKING:
            return None
        return await self._call(self.actor, "pressure")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._restart_task is not None:
            self._restart_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._restart_task
        if self.state in _WORKING:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_future(self.actor.close.remote()), timeout=30)
        if self.actor is not None:
            kill_actor(self.actor)
        self.pool.changed.fire()

    # ------------------------------------------------------------ helpers
    async def loaded_versions(self) -> list[int]:
        """The versions the current incarnation loaded, as the worker recorded them."""
        return await self.actor.loaded_versions.remote()

    async def _usable(self) -> Any:
        """The actor to send a group to; waits while the worker restarts."""
        while True:
            if self.state == ALIVE:
                return self.actor
            if self.state in (LOST, VACANT, DRAINING) or self._closed:
                if not self.pool.any_left():
                    raise self.pool.all_lost_error()
                if self.pool.any_healthy():
                    # The controller picks a lost worker only when none is healthy;
                    # now one is, so send the group back to be placed there.
                    raise EngineUnavailable(f"rollout worker {self.index} is gone for good")
            await self.pool.changed.wait()

    async def _call(self, actor: Any, method: str, *args: Any) -> Any:
        try:
            return await getattr(actor, method).remote(*args)
        except RayActorError as exc:
            self._lost(actor, exc)
            return None

    async def _load(self, actor: Any, ref: Any, version: int) -> None:
        try:
            loaded = await actor.update_weights.remote(ref, version)
        except RayActorError as exc:
            self._lost(actor, exc)
            return
        except RayTaskError:
            if self.state == VACANT or actor is not self.actor:
                return  # the worker left the fleet while it loaded: its weights are moot
            raise
        if actor is self.actor:
            self._version = loaded
            append_bounded(self.versions[-1], loaded)

    def _lost(self, actor: Any, exc: BaseException) -> None:
        """The worker behind ``actor`` died: restart it, or give it up."""
        if actor is not self.actor or self.state not in _WORKING or self._closed:
            return  # this death is already being handled
        kill_actor(actor)
        if self.state == DRAINING or len(self.pool.serving()) > self.pool.min_workers > 0:
            # Leaving anyway, or the fleet is above its minimum: no restart, one smaller.
            log.warning("rollout worker %d (pid %d) died (%s); the fleet goes on without it",
                        self.index, self.pid, _reason(exc))
            self.state = VACANT
        elif self.restarts < self.max_restarts:
            log.warning("rollout worker %d (pid %d) died (%s); restarting it (%d of %d)",
                        self.index, self.pid, _reason(exc), self.restarts + 1, self.max_restarts)
            self.state = RESTARTING
            # Supervised by the run: an unexpected error of the restart reaches it.
            self._restart_task = supervision.spawn(
                self._restart(), name=f"asyncrl-restart-worker-{self.index}"
            )
        else:
            log.warning("rollout worker %d (pid %d) died (%s) and has no restart left "
                        "(cluster.max_worker_restarts=%d); the run goes on without it",
                        self.index, self.pid, _reason(exc), self.max_restarts)
            self.state = LOST
        self.pool.changed.fire()

    async def _restart(self) -> None:
        """Start a new incarnation, retrying with exponential backoff while restarts
        are left. Whatever happens (an error, a cancellation), the worker ends
        ALIVE or LOST, never stuck RESTARTING: a run with one worker cannot
        hang on a restart that went wrong."""
        delay = RESTART_BACKOFF_S
        try:
            while True:
                self.restarts += 1
                try:
                    actor, info = await self._start_incarnation()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if self.restarts >= self.max_restarts:
                        log.warning("restarting rollout worker %d failed (%s) and it has no "
                                    "restart left; the run goes on without it",
                                    self.index, _reason(exc))
                        return
                    log.warning("restarting rollout worker %d failed (%s); trying again in "
                                "%.1fs", self.index, _reason(exc), delay)
                    await asyncio.sleep(delay)  # backoff between restarts, not a poll
                    delay = min(2 * delay, MAX_RESTART_BACKOFF_S)
                    continue
                # Nothing awaits between the last catch-up load and this point, so
                # the worker holds the newest version when it becomes healthy.
                self.actor, self.pid, self.node_id = actor, info["pid"], info["node_id"]
                self._version = info["version"]
                self.versions.append(info["loaded"])
                self.state = ALIVE
                log.warning("rollout worker %d restarted (pid %d) with weights of version %d",
                            self.index, self.pid, self._version)
                return
        finally:
            if self.state == RESTARTING:
                self.state = LOST
            self.pool.changed.fire()

    async def _start_incarnation(self) -> tuple[Any, dict[str, Any]]:
        """A new actor holding the newest weights (catching up on any version
        that arrived while it started)."""
        actor = self._spawn(self.index, self.incarnations, self.pool.weights, self.pool.version)
        self.incarnations += 1
        try:
            info = await asyncio.wait_for(_future(actor.ready.remote()), self.startup_timeout_s)
            loaded = [info["version"]]
            while info["version"] < self.pool.version:
                info["version"] = await actor.update_weights.remote(
                    self.pool.weights, self.pool.version
                )
                loaded.append(info["version"])
        except BaseException:
            kill_actor(actor)
            raise
        info["loaded"] = loaded
        return actor, info


class RayTrainer:
    """A :class:`~asyncrl.trainers.Trainer` whose work runs in a Ray actor (a
    :class:`~asyncrl.cluster.actors.TrainerWorker`). The trainer holds state no
    one else has (weights, optimizer), so its death fails the run with
    :class:`~asyncrl.errors.TrainerLost`."""

    def __init__(self, actor: Any, info: dict[str, Any]) -> None:
        self.actor = actor
        self.pid: int = info["pid"]
        self.node_id: str = info["node_id"]
        #: The version of the weights the trainer holds (steps it took).
        self.version: int = info["version"]
        self._closed = False

    def _lost(self, what: str, exc: BaseException) -> TrainerLost:
        return TrainerLost(
            f"the trainer actor (pid {self.pid}) died during {what} ({_reason(exc)}); its "
            f"weights and optimizer state are gone, so the run cannot go on. {_RESUME_HINT}"
        )

    async def _await(self, what: str, ref: Any) -> Any:
        try:
            return await ref
        except RayActorError as exc:
            raise self._lost(what, exc) from exc

    def _get(self, what: str, ref: Any) -> Any:
        try:
            return ray.get(ref)
        except RayActorError as exc:
            raise self._lost(what, exc) from exc

    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        return await self._await("train_chunk", self.actor.train_chunk.remote(list(rollouts), step))

    async def finish_step(self, *, step: int) -> dict[str, float]:
        metrics = await self._await("finish_step", self.actor.finish_step.remote(step))
        self.version = step + 1
        return metrics

    async def get_weights(self) -> Any:
        """An ObjectRef to the new weights (what ``RayEngine.update_weights`` takes)."""
        version, weights = self.actor.get_weights.options(num_returns=2).remote()
        # Both returns are stored when the call ends: awaiting the small one
        # surfaces errors without fetching the weights to the driver.
        self.version = await self._await("get_weights", version)
        return weights

    def state_dict(self) -> dict[str, Any]:
        # Synchronous, as the protocol says: the checkpoint hook calls it in a
        # worker thread, so the driver's loop keeps serving while the state travels.
        return self._get("state_dict", self.actor.state_dict.remote())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.version = self._get("load_state_dict", self.actor.load_state_dict.remote(state))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            await asyncio.wait_for(_future(self.actor.close.remote()), timeout=30)
        kill_actor(self.actor)


__all__ = ["RayEngine", "RayTrainer", "WorkerPool", "kill_actor"]
