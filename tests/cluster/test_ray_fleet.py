"""The Ray backend's elastic fleet (issue 35) on the real proxies, with fake
actors in virtual time (no Ray instance): vacant slots, joining at the newest
weights, draining, handing groups over with their tokens, no restart above
``min``, and refused scales."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs the optional 'ray' package")

from asyncrl.cluster.fleet import RayFleet  # noqa: E402
from asyncrl.cluster.proxies import RayEngine, WorkerPool  # noqa: E402
from asyncrl.errors import EngineLeft, EngineUnavailable, FleetError  # noqa: E402
from asyncrl.types import (  # noqa: E402
    Completion,
    GenerationRequest,
    GroupAborted,
    GroupResult,
    Prompt,
)
from tests.vtime import settle, virtual  # noqa: E402


class Ref(asyncio.Future):
    """What a fake actor method returns: awaitable, like an ObjectRef."""

    task: asyncio.Task[None] | None = None

    def future(self) -> Ref:
        return self


class Method:
    def __init__(self, fn) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Ref:
        ref = Ref()

        async def run():
            try:
                ref.set_result(await self.fn(*args))
            except BaseException as exc:  # handed to the awaiting proxy
                ref.set_exception(exc)

        ref.task = asyncio.ensure_future(run())  # kept: a task only weakly referenced may vanish
        return ref


class FakeWorker:
    """An EngineWorker stand-in: one token per completion at once, the second
    when the test releases it; an abort ends the group with its first token."""

    def __init__(self, index: int, version: int, ready_gate: asyncio.Event | None = None,
                 die: bool = False) -> None:
        self.index, self.version, self.die = index, version, die
        self.release, self.ready_gate = asyncio.Event(), ready_gate
        self.aborted: set[Any] = set()
        self.loaded = [version]
        self.closed = False
        self.ready = Method(self._ready)
        self.generate = Method(self._generate)
        self.update_weights = Method(self._update)
        self.abort = Method(self._abort)
        self.close = Method(self._close)

    async def _ready(self) -> dict[str, Any]:
        if self.ready_gate is not None:
            await self.ready_gate.wait()
        return {"pid": 1000 + self.index, "node_id": "n", "version": self.version}

    async def _update(self, ref: Any, version: int) -> int:
        self.version = version
        self.loaded.append(version)
        return version

    async def _generate(self, request: GenerationRequest) -> GroupResult:
        if self.die:
            raise ray.exceptions.RayActorError()
        v = self.version
        await self.release.wait()  # set by the test, or by an abort
        ids = [5] if request.group_id in self.aborted else [5, 6]
        reason = None if request.group_id in self.aborted else "stop"
        result = GroupResult(request.group_id, [1], [
            Completion(ids, [-0.5] * len(ids), ((v, len(ids)),), reason, "x")
            for _ in range(request.num_generations)], request.start_weight or v)
        if request.group_id in self.aborted:
            raise GroupAborted(request.group_id, partial=result)
        return result

    async def _abort(self, gids: list[Any]) -> None:
        self.aborted.update(gids)
        self.release.set()  # wakes the waiting groups; aborted ones end with one token

    async def _close(self) -> None:
        self.closed = True


def fleet_of(started: int, slots: int, *, min_size: int = 1, gate=None):
    pool = WorkerPool(weights(0), 0)
    RayFleet(pool, min_size=min_size, max_size=slots)
    spawned: list[FakeWorker] = []

    def spawn(index, incarnation, weights, version):
        worker = FakeWorker(index, version, ready_gate=gate)
        spawned.append(worker)
        return worker

    engines = []
    for i in range(slots):
        actor = FakeWorker(i, 0) if i < started else None
        info = {"pid": 1000 + i, "node_id": "n", "version": 0} if actor else None
        engines.append(RayEngine(pool, i, spawn, actor, info, max_restarts=1,
                                 startup_timeout_s=60.0))
    return pool, engines, spawned


def weights(v: int) -> Any:
    """An object-store ref as the trainer hands one over (never resolved here:
    the fake workers only pass it on), so the pool puts nothing in Ray."""
    return ray.ObjectRef(v.to_bytes(28, "big"))


def req(gid: int, start: int = 0) -> GenerationRequest:
    return GenerationRequest(gid, Prompt(gid, "1+1="), 2, start_weight=start)


@virtual
async def test_a_vacant_slot_joins_at_the_newest_weights_catching_up_a_sync_meanwhile():
    gate = asyncio.Event()
    pool, (first, second), spawned = fleet_of(1, 2, gate=gate)
    assert second.state == "vacant" and not second.healthy and first.capabilities.fleet
    for v in (1, 2):
        ref = weights(v)
        await asyncio.gather(*(e.update_weights(ref, v) for e in (first, second)))
    scaling = asyncio.ensure_future(pool.fleet.scale(2))
    await settle()
    assert [m.health for m in pool.fleet.members()] == ["healthy", "joining"]
    ref = weights(3)
    await asyncio.gather(*(e.update_weights(ref, 3) for e in (first, second)))  # meanwhile
    gate.set()
    await scaling
    (worker,) = spawned
    assert worker.loaded == [2, 3] and second.healthy and second.weight_version == 3
    assert second.versions[-1] == [2, 3]


@virtual
async def test_scale_down_drains_the_newest_worker_and_its_group_finishes():
    pool, (first, second), _ = fleet_of(2, 2)
    on_second = asyncio.ensure_future(second.generate(req(7)))
    await settle()
    scaling = asyncio.ensure_future(pool.fleet.scale(1))
    await settle()
    assert second.state == "draining" and not second.healthy and not scaling.done()
    actor = second.actor
    actor.release.set()
    result = await on_second
    assert result.completions[0].finish_reason == "stop"  # finished, not aborted
    await scaling
    assert second.state == "vacant" and actor.closed and first.state == "alive"


@virtual
async def test_remove_with_abort_hands_the_group_over_with_its_tokens():
    pool, (_, second), _ = fleet_of(2, 2)
    on_second = asyncio.ensure_future(second.generate(req(7)))
    await settle()
    await pool.fleet.remove("worker 1", abort=True)
    with pytest.raises(EngineLeft) as left:
        await on_second
    assert [c.token_ids for c in left.value.partial.completions] == [[5], [5]]
    assert second.state == "vacant"


@virtual
async def test_a_worker_lost_above_min_is_not_restarted_and_at_min_it_is():
    _, (first, second), spawned = fleet_of(2, 2, min_size=1)
    second.actor.die = True
    with pytest.raises(EngineUnavailable):
        await second.generate(req(1))
    assert second.state == "vacant" and second.restarts == 0 and not spawned
    first.actor.die = True  # the last one: at min, so restarted
    with pytest.raises(EngineUnavailable):
        await first.generate(req(2))
    await settle()
    assert first.state == "alive" and first.restarts == 1 and len(spawned) == 1


@virtual
async def test_refused_scales_change_nothing():
    pool, engines, spawned = fleet_of(1, 2)
    with pytest.raises(FleetError, match=r"above cluster\.rollout_workers\.max=2"):
        await pool.fleet.scale(3)
    with pytest.raises(FleetError, match=r"below cluster\.rollout_workers\.min=1"):
        await pool.fleet.scale(0)
    with pytest.raises(FleetError, match="scale N"):
        await pool.fleet.add("http://x:1")
    with pytest.raises(FleetError, match="not a working rollout worker"):
        await pool.fleet.remove("worker 1")
    assert [e.state for e in engines] == ["alive", "vacant"] and not spawned
