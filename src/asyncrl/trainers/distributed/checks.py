"""What ``asyncrl validate`` (and ``train``, before anything starts) checks of the
``trainer`` block beyond its own fields (those the config model refuses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from asyncrl.errors import ConfigError

if TYPE_CHECKING:
    from asyncrl.config import ClusterConfig, TrainerConfig


def collective_backend(trainer: TrainerConfig, device: str) -> str:
    """``trainer.backend``, with ``auto`` resolved for ``device`` (``policy.device``)."""
    if trainer.backend != "auto":
        return trainer.backend
    return "nccl" if device.startswith("cuda") else "gloo"


def check_trainer(trainer: TrainerConfig, *, device: str, cluster: ClusterConfig) -> None:
    """Refuse a sharded trainer this machine (or cluster request) cannot run
    (``device``: ``policy.device``)."""
    t = trainer
    if t.strategy != "fsdp":
        return
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        raise ConfigError(
            "trainer.strategy=fsdp needs torch.distributed, which this torch build lacks; "
            "install a torch build with distributed support, or set trainer.strategy: single")
    backend = collective_backend(t, device)
    if backend == "nccl" and not dist.is_nccl_available():
        raise ConfigError(
            f"trainer.backend resolves to nccl (policy.device={device!r}) but this "
            f"torch ({torch.__version__}) has no NCCL; install a CUDA build of torch, or set "
            "trainer.backend: gloo")
    cuda = device.startswith("cuda")
    if cuda and cluster.backend == "local":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if t.world_size > count:
            raise ConfigError(
                f"trainer.world_size={t.world_size} ranks need one GPU each with policy.device="
                f"{device!r}, but this machine has {count} visible; set "
                f"trainer.world_size to at most {count}, or run the ranks on a Ray cluster "
                "(cluster.backend: ray)")
    if cuda and cluster.backend == "ray" and cluster.trainer.num_gpus < 1:
        raise ConfigError(
            f"trainer.strategy=fsdp with policy.device={device!r} on Ray: each of the "
            f"{t.world_size} ranks is an actor that needs a GPU of its own, but "
            f"cluster.trainer.num_gpus={cluster.trainer.num_gpus:g}; set "
            "cluster.trainer.num_gpus: 1")


def trainer_layout(trainer: TrainerConfig, *, device: str, cluster_backend: str) -> str:
    """The trainer's layout in words, for ``asyncrl validate`` (``cluster_backend``:
    ``cluster.backend``)."""
    t = trainer
    if t.strategy == "single":
        return "single (in-process)" if cluster_backend == "local" else "single (one Ray actor)"
    where = "local processes" if cluster_backend == "local" else "Ray actors"
    return (f"fsdp over {t.world_size} rank{'s' * (t.world_size > 1)} "
            f"({collective_backend(t, device)}, {where})")


__all__ = ["check_trainer", "collective_backend", "trainer_layout"]
