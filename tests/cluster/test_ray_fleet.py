"""The Ray backend's elastic fleet (issue 35) on the real proxies, with fake
actors in virtual time (no Ray instance): vacant slots, joining at the newest
weights, draining, handing groups over with their tokens, no restart above
``min``, refused scales, and workers Ray cannot place: refused up front, or
waited for with a progress line, cancelled by a removal, timed out with the
numbers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend needs the optional 'ray' package")

from asyncrl.cluster import proxies  # noqa: E402
from asyncrl.cluster.fleet import RayFleet  # noqa: E402
from asyncrl.cluster.placement import Placement  # noqa: E402
from asyncrl.cluster.proxies import RayEngine, WorkerPool  # noqa: E402
from asyncrl.controller.fleet import format_rows  # noqa: E402
from asyncrl.engines.fleet import progress  # noqa: E402
from asyncrl.errors import EngineLeft, EngineUnavailable, FleetError  # noqa: E402
from asyncrl.types import (  # noqa: E402
    Completion,
    GenerationRequest,
    GroupAborted,
    GroupResult,
    Prompt,
)
from tests.vtime import advance, settle, virtual  # noqa: E402


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
                result = await self.fn(*args)
            except Exception as exc:  # handed to the awaiting proxy
                ref.set_exception(exc)
            else:
                ref.set_result(result)

        ref.task = asyncio.ensure_future(run())  # kept: a task only weakly referenced may vanish
        # A ref the proxy gives up on (a start it cancels) stops the call, as killing
        # the actor does.
        ref.add_done_callback(lambda _: ref.task.cancel())
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


def fleet_of(started: int, slots: int, *, min_size: int = 1, gate=None, placement=None):
    pool = WorkerPool(weights(0), 0)
    RayFleet(pool, min_size=min_size, max_size=slots, placement=placement)
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
async def test_a_scale_up_past_a_worker_still_draining_is_refused_not_short():
    """Found in review: with the fleet's lock gone, `scale 2` while worker 1 still
    drains saw one worker serving and no vacant slot, answered at once and left
    the fleet at 1. It is refused, naming the worker, and changes nothing."""
    pool, (first, second), spawned = fleet_of(2, 2)
    on_second = asyncio.ensure_future(second.generate(req(7)))
    await settle()
    leaving = asyncio.ensure_future(pool.fleet.scale(1))
    await settle()
    assert second.state == "draining"
    with pytest.raises(FleetError, match=r"^fleet scale 2: worker 1 is still leaving the fleet"):
        await pool.fleet.scale(2)
    assert [first.state, second.state] == ["alive", "draining"] and not spawned
    second.actor.release.set()
    await on_second
    await leaving
    await pool.fleet.scale(2)  # once it has left, its slot starts a worker again
    assert second.state == "alive" and len(spawned) == 1


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


def two_cpus(*, autoscaling: bool) -> Placement:
    """The new user's box: 2 CPUs, a 1-CPU trainer and two 0.5-CPU workers hold them all."""
    return Placement({"CPU": 0.5}, {"CPU": 1.0}, autoscaling=autoscaling,
                     available=lambda: {"CPU": 0.0}, total=lambda: {"CPU": 2.0})


@pytest.fixture
def killed(monkeypatch) -> list[Any]:
    """The actors the proxies kill (no Ray instance here to kill them in)."""
    seen: list[Any] = []
    monkeypatch.setattr(proxies, "kill_actor", seen.append)
    return seen


@virtual
async def test_a_scale_the_cluster_can_never_hold_is_refused_at_once_with_the_numbers():
    pool, engines, spawned = fleet_of(2, 3, placement=two_cpus(autoscaling=False))
    with pytest.raises(FleetError) as refused:
        await pool.fleet.scale(3)
    assert str(refused.value) == (
        "Ray cannot place 1 more rollout worker: each asks for CPU 0.5 "
        "(cluster.rollout_worker); of the cluster's CPU 2 this run's trainer and 2 workers "
        "hold CPU 2. Lower cluster.rollout_worker.num_cpus/num_gpus, add nodes to the Ray "
        "cluster, or scale to 2 at most")
    assert [e.state for e in engines] == ["alive", "alive", "vacant"] and not spawned


@virtual
async def test_a_worker_ray_cannot_place_yet_says_so_and_its_timeout_names_the_numbers(killed):
    """With an autoscaler (cluster.address set) the same request waits, bounded by
    cluster.actor_startup_timeout_s (60 s here), with a progress line."""
    pool, engines, spawned = fleet_of(2, 3, gate=asyncio.Event(),  # never set: not placed
                                      placement=two_cpus(autoscaling=True))
    told: list[str] = []
    progress.set(told.append)  # as the control channel does for a command
    scaling = asyncio.ensure_future(pool.fleet.scale(3))
    await settle()
    assert told == [
        "rollout worker 2: waiting for Ray to place it (it asks for CPU 0.5 "
        "(cluster.rollout_worker); the cluster has CPU 0 of 2 available); the Ray cluster "
        "cannot hold 3 rollout workers now (at most 2); waiting for its autoscaler to add a "
        "node. Up to cluster.actor_startup_timeout_s=60s; `asyncrl fleet RUN_DIR remove "
        "'worker 2'` cancels it"]
    with pytest.raises(FleetError) as timed_out:
        await scaling
    assert str(timed_out.value).startswith(
        "rollout worker 2 did not start within cluster.actor_startup_timeout_s=60s: it asks "
        "for CPU 0.5 (cluster.rollout_worker); the cluster has CPU 0 of 2 available. If Ray "
        "could not place it: lower cluster.rollout_worker.num_cpus/num_gpus")
    assert engines[2].state == "vacant" and killed == spawned


@virtual
async def test_a_worker_that_never_starts_is_cancelled_by_remove_and_by_a_scale_down(killed):
    """The new user's hang: `scale 3` waited on a worker Ray could not place, and
    `remove "worker 2" --abort` and `scale 2` queued behind it. Now they cancel
    its start (its pending actor killed), and `status` says how long it waited."""
    pool, (first, second, third), spawned = fleet_of(1, 3, gate=asyncio.Event())
    scaling = asyncio.ensure_future(pool.fleet.scale(3))
    await settle()
    await advance(42)
    assert format_rows(pool.fleet.members(), 0)[2:] == [
        "worker 0        0          0  healthy",
        "worker 1        0          0  joining for 42s",
        "worker 2        0          0  joining for 42s"]
    # A group the controller sent to a joining slot (none was healthy then).
    waiting = asyncio.ensure_future(third.generate(req(9)))
    gone = await pool.fleet.remove("worker 2", abort=True)  # answers at once
    assert gone.health == "gone" and third.state == "vacant" and killed == [spawned[1]]
    with pytest.raises(EngineUnavailable):  # retried elsewhere: no group is lost
        await waiting
    assert [m.name for m in await pool.fleet.scale(1)] == ["worker 0"]  # cancels worker 1's
    assert second.state == "vacant" and killed == [spawned[1], spawned[0]]
    with pytest.raises(FleetError, match=r"^2 rollout workers did not join \(worker 1, 2\): its "
                                         r"start was cancelled \(by a later fleet command, or "
                                         r"the engines closing\); 1 of 3 work$"):
        await scaling
    assert first.state == "alive" and not any(e.inflight for e in (first, second, third))
