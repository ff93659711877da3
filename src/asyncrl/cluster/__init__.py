"""The Ray backend (``cluster.backend: ray``): rollout workers and the trainer as
Ray actors, driven by the same single-process controller. See docs/ray.md.

Ray is an optional extra (``pip install 'asyncrl[ray]'``): nothing here imports
it until a Ray backend is built or one of its classes is used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.cluster.backend import ActorStartError, connect
    from asyncrl.cluster.proxies import RayEngine, RayTrainer, WorkerPool
    from asyncrl.config import ClusterConfig, PolicyConfig
    from asyncrl.engines.options import EngineOptions
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.distributed.options import ShardedOptions
    from asyncrl.trainers.options import TrainerOptions

__all__ = [
    "ActorStartError",
    "RayEngine",
    "RayTrainer",
    "WorkerPool",
    "build_ray_backends",
    "connect",
]


def build_ray_backends(
    cluster: ClusterConfig, policy: PolicyConfig, task: Task, *,
    engine_options: EngineOptions, trainer_options: TrainerOptions,
    sharded: ShardedOptions | None = None, seed: int = 0,
) -> tuple[list[RayEngine], RayTrainer]:
    """``(engines, trainer)``: driver-side proxies of ``cluster.num_rollout_workers``
    rollout-worker actors and one trainer actor (or the ranks of ``sharded``),
    started on the Ray instance at ``cluster.address`` (a local one when None)."""
    from asyncrl.cluster.backend import build_ray_backends as build

    return build(cluster, policy, task, engine_options=engine_options,
                 trainer_options=trainer_options, sharded=sharded, seed=seed)


def __getattr__(name: str) -> Any:
    if name in ("RayEngine", "RayTrainer", "WorkerPool"):
        from asyncrl.cluster import proxies

        return getattr(proxies, name)
    if name in ("ActorStartError", "connect"):
        from asyncrl.cluster import backend

        return getattr(backend, name)
    raise AttributeError(f"module 'asyncrl.cluster' has no attribute {name!r}")
