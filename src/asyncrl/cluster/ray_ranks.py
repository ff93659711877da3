"""The sharded trainer's ranks as Ray actors (``cluster.backend: ray`` with
``trainer.strategy: fsdp``).

The ``trainer.world_size`` ranks are placed together in one placement group,
one bundle of ``cluster.trainer`` resources per rank (``PACK``: on as few nodes
as fit), so a trainer may span nodes. Rank 0's actor picks the rendezvous
address (its node's IP and a free port); then every actor builds its
:class:`~asyncrl.trainers.distributed.rank_core.RankCore`. Ray runs each actor's
calls one at a time, in the order they were made, which is the order every
rank must see.

The full weights leave rank 0 as the second return of a two-return call: one
object in the object store, whose reference the driver passes on to the
rollout workers without fetching the tensors, as with the single trainer actor.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

from asyncrl.cluster.proxies import kill_actor, ray
from asyncrl.errors import ActorStartError
from asyncrl.trainers.distributed.rank_protocol import RankDied, RankFailed


class RankActor:
    """One trainer rank (plain Python; made a Ray actor class by :func:`_actor_class`)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.core: Any = None

    def address(self) -> str:
        """Called on rank 0 first: serve the rendezvous store (up before any rank
        starts, so none backs off waiting for it) and return its address."""
        import datetime

        import torch.distributed as dist

        from asyncrl.trainers.distributed.processes import STORE_TIMEOUT_S

        ip = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(ip, 0, is_master=True, wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
        return f"tcp://{ip}:{self._store.port}"

    def start(self, spec: Any) -> dict[str, Any]:
        from asyncrl.trainers.distributed.rank_core import RankCore

        # Ray shows each actor only its own GPUs: the rank's device is the first one.
        self.core = RankCore(spec, self.rank, device_index=0)
        return self.core.info()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.core, method)(*args)

    def weights(self) -> tuple[None, dict[str, Any] | None]:
        """Called with ``num_returns=2``: the driver waits on the small first
        return; the second, rank 0's full weights, goes to the object store and
        from there to the rollout workers, never to the driver."""
        stream = self.core.weights()
        names = [name for name, *_ in stream.header]
        weights: dict[str, Any] = {}
        tensors = iter(stream.tensors)
        for name, _, _, alias in stream.header:
            weights[name] = weights[names[alias]] if alias is not None else next(tensors)
        for _ in tensors:  # (nothing left: every gather ran)
            pass
        return None, weights if self.rank == 0 else None


@functools.cache
def _actor_class() -> Any:
    return ray.remote(RankActor)


def _translate(ref: Any, rank: int, value: Any = None) -> Future[Any]:
    """A future of ``ref`` (or of ``value`` once ``ref`` is done) whose failures are
    :class:`RankDied` / :class:`RankFailed`."""
    out: Future[Any] = Future()

    def done(inner: Future[Any]) -> None:
        exc = inner.exception()
        if exc is None:
            out.set_result(inner.result() if value is None else value)
        elif isinstance(exc, ray.exceptions.RayActorError):
            out.set_exception(RankDied(rank, f"its actor died ({str(exc).splitlines()[0]})"))
        else:
            cause = getattr(exc, "cause", None) or exc
            out.set_exception(RankFailed(rank, f"{type(cause).__name__}: {cause}"))

    ref.future().add_done_callback(done)
    return out


class RayRanks:
    """:class:`~asyncrl.trainers.distributed.rank_protocol.Ranks` as Ray actors.

    Construction places the actors and starts building the ranks without
    waiting; :meth:`initial_weights` and the rollout workers can start meanwhile,
    and :meth:`wait_started` waits for all of it."""

    def __init__(self, spec_of: Any, world_size: int, cluster: Any) -> None:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.world_size = world_size
        self.timeout = cluster.actor_startup_timeout_s
        res = cluster.trainer
        bundle = {"CPU": res.num_cpus, **({"GPU": res.num_gpus} if res.num_gpus else {})}
        self._pg = placement_group([dict(bundle) for _ in range(world_size)], strategy="PACK")
        self._remove = remove_placement_group
        self.actors: list[Any] = []
        self.infos: list[dict[str, Any]] = []
        self._pending: list[Future[Any]] = []
        try:
            try:
                ray.get(self._pg.ready(), timeout=self.timeout)
            except ray.exceptions.GetTimeoutError:
                raise ActorStartError(
                    f"the {world_size} trainer ranks ({bundle} each, cluster.trainer) could not "
                    f"be placed within cluster.actor_startup_timeout_s={self.timeout:g}s; the "
                    f"cluster has {ray.available_resources()} available. Lower "
                    "trainer.world_size or the cluster.trainer request, or add nodes") from None
            cls = _actor_class()
            for rank in range(world_size):
                strategy = PlacementGroupSchedulingStrategy(
                    self._pg, placement_group_bundle_index=rank)
                self.actors.append(cls.options(
                    num_cpus=res.num_cpus, num_gpus=res.num_gpus, scheduling_strategy=strategy,
                    max_restarts=0, max_task_retries=0).remote(rank))
            spec = spec_of(ray.get(self.actors[0].address.remote(), timeout=self.timeout))
            self._started = [a.start.remote(spec) for a in self.actors]
        except BaseException:
            self.kill()
            raise

    def initial_weights(self) -> Any:
        """Rank 0's weights as an ObjectRef, asked for now (after the start-up)."""
        self._pending = self.submit("weights", [()] * self.world_size)
        return self._weights_ref

    def wait_started(self) -> None:
        """Wait until every rank is built (and the initial weights gathered)."""
        from concurrent.futures import wait

        try:
            self.infos = ray.get(self._started, timeout=self.timeout)
        except ray.exceptions.GetTimeoutError:
            raise ActorStartError(
                f"the trainer ranks did not start within cluster.actor_startup_timeout_s="
                f"{self.timeout:g}s") from None
        except ray.exceptions.RayError as exc:
            raise ActorStartError(f"a trainer rank failed to start: {exc}") from exc
        wait(self._pending)
        for future in self._pending:
            if future.exception() is not None:
                raise ActorStartError(f"gathering the initial weights failed: "
                                      f"{future.exception()}")

    def submit(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Future[Any]]:
        if method != "weights":
            return [_translate(actor.call.remote(method, *args[rank]), rank)
                    for rank, actor in enumerate(self.actors)]
        futures = []
        for rank, actor in enumerate(self.actors):
            ack, weights = actor.weights.options(num_returns=2).remote()
            if rank == 0:
                self._weights_ref = weights
            futures.append(_translate(ack, rank, value=weights if rank == 0 else None))
        return futures

    def describe(self, rank: int) -> str:
        info = self.infos[rank] if rank < len(self.infos) else {"pid": "?", "host": "?"}
        return f"rank {rank} (pid {info['pid']} on {info['host']})"

    def engine_weights(self, result: Any) -> Any:
        return result

    def kill(self) -> None:
        for actor in self.actors:
            kill_actor(actor)
        with contextlib.suppress(Exception):
            self._remove(self._pg)

    def close(self, timeout: float) -> None:
        from concurrent.futures import wait

        wait(self.submit("close", [()] * self.world_size), timeout=timeout)
        self.kill()


__all__ = ["RankActor", "RayRanks"]
