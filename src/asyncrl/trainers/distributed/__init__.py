"""The sharded trainer (``trainer.strategy: fsdp``): FSDP2 over ``trainer.world_size``
ranks, driven through the same :class:`~asyncrl.trainers.Trainer` protocol as
the in-process trainer. See docs/distributed.md.

Importing this package does not import torch.distributed; the pieces load on use.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.trainers.distributed.trainer import DistributedTrainer

__all__ = ["DistributedTrainer", "build_local_trainer"]

log = logging.getLogger("asyncrl.trainers.distributed")


def build_local_trainer(cfg: RunConfig, task: Any, *, weights_device: str = "cpu",
                        run_dir: str | Path | None = None) -> DistributedTrainer:
    """The sharded trainer of ``cfg`` with its ranks as processes on this machine
    (started and ready when this returns)."""
    from asyncrl.trainers.distributed.checks import collective_backend
    from asyncrl.trainers.distributed.processes import start_local_ranks
    from asyncrl.trainers.distributed.rank_core import RankSpec
    from asyncrl.trainers.distributed.trainer import DistributedTrainer

    world_size = cfg.trainer.world_size
    ranks = start_local_ranks(lambda init: RankSpec(cfg, task, world_size, init),
                              world_size, cfg.cluster.actor_startup_timeout_s)
    log.info("sharded trainer started: %d ranks (pids %s) over %s", world_size,
             ", ".join(str(p.pid) for p in ranks.procs), collective_backend(cfg))
    return DistributedTrainer(ranks, cfg, weights_device=weights_device, run_dir=run_dir)


def __getattr__(name: str) -> Any:
    if name == "DistributedTrainer":
        from asyncrl.trainers.distributed.trainer import DistributedTrainer

        return DistributedTrainer
    raise AttributeError(f"module 'asyncrl.trainers.distributed' has no attribute {name!r}")
