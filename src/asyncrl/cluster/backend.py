"""``build_ray_backends``: connect to Ray, start the actors, return their proxies."""

from __future__ import annotations

import functools
import logging
import os
from typing import TYPE_CHECKING, Any

from asyncrl.cluster.actors import EngineWorker, TrainerWorker
from asyncrl.cluster.fleet import RayFleet
from asyncrl.cluster.placement import Placement, asks
from asyncrl.cluster.proxies import RayEngine, RayTrainer, WorkerPool, kill_actor, ray
from asyncrl.config import ActorResources, ClusterConfig
from asyncrl.engines.options import EngineOptions
from asyncrl.errors import ActorStartError, ConfigError
from asyncrl.trainers.distributed.trainer import DistributedTrainer

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.distributed.options import ShardedOptions
    from asyncrl.trainers.options import TrainerOptions

log = logging.getLogger("asyncrl.cluster")


def connect(cluster: ClusterConfig) -> None:
    """Join the Ray instance at ``cluster.address``, or start a local one when
    it is None; a driver already connected (``ray.init`` called by the user)
    is kept as it is."""
    if ray.is_initialized():
        return
    kwargs = dict(cluster.ray_init)
    if cluster.address is None:
        # The dashboard is slow to start and needs extra packages; ask for it
        # through cluster.ray_init when wanted.
        kwargs.setdefault("include_dashboard", False)
    ray.init(address=cluster.address, **kwargs)


@functools.cache
def _actor_classes() -> tuple[Any, Any]:
    return ray.remote(EngineWorker), ray.remote(TrainerWorker)


def _options(res: ActorResources) -> dict[str, Any]:
    # Restarts are the proxies' job (they must reload the newest weights), so
    # Ray itself never restarts an actor nor retries a call on a new one.
    return {"num_cpus": res.num_cpus, "num_gpus": res.num_gpus,
            "max_restarts": 0, "max_task_retries": 0}


def _check_devices(c: ClusterConfig, device: str) -> None:
    """``device``: ``policy.device``."""
    if device.startswith("cuda"):
        for name, res in (("rollout_worker", c.rollout_worker), ("trainer", c.trainer)):
            if res.num_gpus <= 0:
                raise ConfigError(
                    f"policy.device={device!r} but cluster.{name}.num_gpus="
                    f"{res.num_gpus}: Ray hides every GPU from an actor that asks for none. "
                    f"Set cluster.{name}.num_gpus (e.g. 1), or policy.device: cpu"
                )
    elif c.rollout_worker.num_gpus > 0 or c.trainer.num_gpus > 0:
        log.warning("the actors reserve GPUs but policy.device=%r: the GPUs stay idle; "
                    "set policy.device: cuda to use them", device)


def _wait_ready(refs: list[Any], what: list[str], c: ClusterConfig) -> list[dict[str, Any]]:
    timeout = c.actor_startup_timeout_s
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise ActorStartError(
            f"the {' and '.join(sorted(set(what)))} actors did not start within "
            f"cluster.actor_startup_timeout_s={timeout}s. They ask for rollout_worker="
            f"{c.rollout_worker.model_dump()} x {c.num_rollout_workers} "
            f"and trainer={c.trainer.model_dump()}; the cluster has "
            f"{ray.available_resources()} available of {ray.cluster_resources()}. Lower the "
            "requests, add nodes, or raise the timeout if building the model is slow"
        ) from None
    except ray.exceptions.RayError as exc:
        raise ActorStartError(f"an actor failed to start: {exc}") from exc


def build_ray_backends(
    cluster: ClusterConfig, policy: PolicyConfig, task: Task, *,
    engine_options: EngineOptions, trainer_options: TrainerOptions,
    sharded: ShardedOptions | None = None, seed: int = 0,
) -> tuple[list[RayEngine], RayTrainer]:
    """Start one trainer actor and ``cluster.num_rollout_workers`` rollout workers
    and return their driver-side proxies ``(engines, trainer)``.

    Each worker builds the engine ``policy.engine`` names with ``engine_options``;
    the trainer actor builds the trainer of ``trainer_options`` over the policy
    seeded by ``seed`` - or, given ``sharded`` (``trainer.strategy: fsdp``), the
    sharded trainer's ranks are actors. The workers start from the trainer's initial
    weights (one object-store copy), so they hold exactly the trainer's version 0
    whatever the policy source.
    """
    c = cluster
    _check_devices(c, policy.device)
    connect(c)
    try:
        # Once in the object store; every actor reads the same copy.
        task_ref = ray.put(task)
    except Exception as exc:
        raise ConfigError(
            f"the task {type(task).__name__} cannot be sent to the Ray actors: it does not "
            f"pickle ({exc}). Keep unpicklable state (open files, locks, clients) out of the "
            "task object, or create it lazily"
        ) from exc
    engine_cls, trainer_cls = _actor_classes()
    actors: list[Any] = []
    ranks: Any = None
    distributed = None
    try:
        if sharded is not None:
            # The ranks build while the workers start: neither waits for the other.
            ranks = _sharded_ranks(sharded, task, c)
            version_ref, weights_ref = 0, ranks.initial_weights()
        else:
            trainer_actor = trainer_cls.options(**_options(c.trainer)).remote(
                policy, trainer_options, task_ref, seed)
            actors.append(trainer_actor)
            version_ref, weights_ref = trainer_actor.get_weights.options(num_returns=2).remote()

        def spawn(index: int, incarnation: int, weights: Any, version: Any) -> Any:
            return engine_cls.options(**_options(c.rollout_worker)).remote(
                policy, engine_options, task_ref, index, incarnation, weights, version
            )

        # The workers are created right away: they start their processes while the
        # trainer builds its model, and Ray hands them the weights once they exist.
        workers = [spawn(i, 0, weights_ref, version_ref) for i in range(c.num_rollout_workers)]
        actors.extend(workers)
        infos = _wait_ready(
            [a.ready.remote() for a in actors],
            ["trainer", *["rollout worker"] * len(workers)][-len(actors):],
            c,
        )
        if sharded is not None:
            ranks.wait_started()
            distributed = DistributedTrainer(ranks, sharded)
        trainer: Any = distributed if distributed is not None else RayTrainer(actors[0], infos[0])
        pool = WorkerPool(weights_ref, trainer.version)
        low, high = c.worker_bounds
        if c.rollout_workers is not None:  # an elastic fleet: scaled by `asyncrl fleet`
            ranks_n = distributed.world_size if distributed is not None else 1
            RayFleet(pool, min_size=low, max_size=high, placement=Placement(
                asks(c.rollout_worker), asks(c.trainer, ranks_n),
                # A cluster the run joins may autoscale; the instance it starts does not.
                # (With address null, ray.init joins the cluster RAY_ADDRESS names, if set.)
                autoscaling=c.address is not None or bool(os.environ.get("RAY_ADDRESS")),
                available=ray.available_resources, total=ray.cluster_resources))
        # Slots above the workers started are vacant until a scale-up fills them.
        started = list(zip(workers, infos[-len(workers):]))
        engines = [
            RayEngine(pool, i, spawn, *(started[i] if i < len(started) else (None, None)),
                      max_restarts=c.max_worker_restarts,
                      startup_timeout_s=c.actor_startup_timeout_s)
            for i in range(max(high, len(started)))
        ]
    except BaseException:
        for actor in actors:
            kill_actor(actor)
        if ranks is not None:
            ranks.kill()
        raise
    log.info("Ray backend: trainer %s, %d rollout workers (%d slots)",
             f"of {distributed.world_size} ranks" if distributed is not None
             else f"on node {trainer.node_id}", len(workers), len(engines))
    return engines, trainer


def _sharded_ranks(options: ShardedOptions, task: Task, cluster: ClusterConfig) -> Any:
    """``trainer.strategy: fsdp``: the ranks as actors in one placement group (starting)."""
    from asyncrl.cluster.ray_ranks import RayRanks
    from asyncrl.trainers.distributed.rank_core import RankSpec

    return RayRanks(lambda init: RankSpec(options, task, init), options.world_size, cluster)
