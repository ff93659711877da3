"""A worker restart is supervised: backoff between tries, and never stuck RESTARTING.

No Ray cluster is needed: the proxy's start of a new incarnation is replaced by
a fake, and the test runs under virtual time.
"""

from __future__ import annotations

import itertools

import pytest

pytest.importorskip("ray")

from asyncrl.cluster.proxies import (
    ALIVE,
    LOST,
    MAX_RESTART_BACKOFF_S,
    RESTART_BACKOFF_S,
    RayEngine,
    WorkerPool,
    kill_actor,
)
from asyncrl.sim.clock import run_virtual


def make_engine(max_restarts: int, starts) -> RayEngine:
    pool = WorkerPool(weights=None, version=0)
    engine = RayEngine(pool, 0, spawn=None, actor=object(), info={
        "pid": 1, "node_id": "n", "version": 0}, max_restarts=max_restarts,
        startup_timeout_s=10.0)
    engine._start_incarnation = starts  # type: ignore[method-assign]
    return engine


def test_failed_restarts_back_off_then_drop_the_worker() -> None:
    tries: list[float] = []

    async def main() -> tuple[RayEngine, float]:
        import asyncio

        loop = asyncio.get_running_loop()

        async def failing():
            tries.append(loop.time())
            raise RuntimeError("node out of memory")

        engine = make_engine(4, failing)
        engine._lost(engine.actor, RuntimeError("worker died"))
        await engine._restart_task
        return engine, loop.time()

    engine, _ = run_virtual(main())
    assert engine.state == LOST and engine.restarts == 4
    gaps = [b - a for a, b in itertools.pairwise(tries)]
    assert gaps == [min(RESTART_BACKOFF_S * 2**k, MAX_RESTART_BACKOFF_S) for k in range(3)]


def test_an_unexpected_error_leaves_the_worker_lost_not_restarting(caplog) -> None:
    async def main() -> RayEngine:
        async def malformed():  # a new actor whose info lacks the pid: a bug, not a failed start
            return object(), {"node_id": "n2", "version": 0, "loaded": [0]}

        engine = make_engine(2, malformed)
        engine._lost(engine.actor, RuntimeError("worker died"))
        with pytest.raises(KeyError):
            await engine._restart_task
        return engine

    engine = run_virtual(main())
    assert engine.state == LOST  # the run sees it gone (goes on, or fails if none is left)
    # The restart task is supervised: inside a run its error stops the run as a bug
    # of the backend (tests/controller/test_failure_classes.py); outside one it is logged.
    assert "background task asyncrl-restart-worker-0 failed outside a run: KeyError" in (
        caplog.text)


def test_a_successful_restart_makes_the_worker_alive_again() -> None:
    async def main() -> RayEngine:
        async def ok():
            return object(), {"pid": 2, "node_id": "n2", "version": 0, "loaded": [0]}

        engine = make_engine(2, ok)
        engine._lost(engine.actor, RuntimeError("worker died"))
        await engine._restart_task
        return engine

    engine = run_virtual(main())
    assert engine.state == ALIVE and engine.pid == 2 and engine.restarts == 1


def test_killing_an_actor_once_ray_is_shut_down_starts_no_new_instance() -> None:
    import ray

    ray.shutdown()  # as after a run's end (a no-op when none runs)
    kill_actor(object())
    assert not ray.is_initialized()


def test_a_workers_load_is_passed_on_where_its_engine_reports_it() -> None:
    """The proxy declares ``pressure`` from the worker's engine and forwards it
    (None from a worker that is gone)."""
    from types import SimpleNamespace

    from asyncrl.engines import EnginePressure

    load = EnginePressure(3, 1, 0.5, 2)

    async def answer() -> EnginePressure:
        return load

    actor = SimpleNamespace(pressure=SimpleNamespace(remote=answer))
    engine = RayEngine(WorkerPool(weights=None, version=0), 0, spawn=None, actor=actor,
                       info={"pid": 1, "node_id": "n", "version": 0,
                             "capabilities": {"abort": True, "pressure": True}},
                       max_restarts=0, startup_timeout_s=10.0)
    assert engine.capabilities.pressure
    assert run_virtual(engine.pressure()) == load
    engine.state = LOST
    assert run_virtual(engine.pressure()) is None
    assert not make_engine(0, None).capabilities.pressure  # a worker that does not say


def test_a_load_that_fails_because_the_worker_left_is_dropped() -> None:
    """A weight sync racing a fleet scale-down: the worker's engine closed under
    the load (its executor shut down). The worker left the fleet, so its load
    does not matter and must not fail the run; on a worker that stays, it does."""
    from types import SimpleNamespace

    from ray.exceptions import RayTaskError

    from asyncrl.cluster.proxies import VACANT

    def actor_failing_loads(engine_box: list) -> SimpleNamespace:
        async def update_weights(ref, version):
            engine_box[0].state = VACANT  # the fleet's leave() runs meanwhile
            raise RayTaskError("update_weights", "", RuntimeError(
                "cannot schedule new futures after shutdown"))
        return SimpleNamespace(update_weights=SimpleNamespace(remote=update_weights))

    box: list = []
    engine = RayEngine(WorkerPool(weights=None, version=0), 0, spawn=None,
                       actor=actor_failing_loads(box),
                       info={"pid": 1, "node_id": "n", "version": 0},
                       max_restarts=0, startup_timeout_s=10.0)
    box.append(engine)
    run_virtual(engine._load(engine.actor, None, 1))  # dropped: no error
    assert engine.state == VACANT and engine._version == 0

    staying = RayEngine(WorkerPool(weights=None, version=0), 0, spawn=None,
                        actor=actor_failing_loads([SimpleNamespace()]),
                        info={"pid": 1, "node_id": "n", "version": 0},
                        max_restarts=0, startup_timeout_s=10.0)
    with pytest.raises(RayTaskError):
        run_virtual(staying._load(staying.actor, None, 1))
    assert staying.state == ALIVE
