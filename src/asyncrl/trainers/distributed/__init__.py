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
    from asyncrl.trainers.distributed.options import ShardedOptions
    from asyncrl.trainers.distributed.trainer import DistributedTrainer

__all__ = ["DistributedTrainer", "ShardedOptions", "build_local_trainer"]

log = logging.getLogger("asyncrl.trainers.distributed")


def build_local_trainer(options: ShardedOptions, task: Any, *, startup_timeout_s: float = 600.0,
                        weights_device: str = "cpu",
                        run_dir: str | Path | None = None) -> DistributedTrainer:
    """The sharded trainer of ``options`` with its ranks as processes on this machine
    (started and ready when this returns, or failed after ``startup_timeout_s``:
    ``cluster.actor_startup_timeout_s``)."""
    from asyncrl.trainers.distributed.processes import start_local_ranks
    from asyncrl.trainers.distributed.rank_core import RankSpec
    from asyncrl.trainers.distributed.trainer import DistributedTrainer

    ranks = start_local_ranks(lambda init: RankSpec(options, task, init),
                              options.world_size, startup_timeout_s)
    log.info("sharded trainer started: %d ranks (pids %s) over %s", options.world_size,
             ", ".join(str(p.pid) for p in ranks.procs), options.backend)
    return DistributedTrainer(ranks, options, weights_device=weights_device, run_dir=run_dir)


def __getattr__(name: str) -> Any:
    if name == "DistributedTrainer":
        from asyncrl.trainers.distributed.trainer import DistributedTrainer

        return DistributedTrainer
    if name == "ShardedOptions":
        from asyncrl.trainers.distributed.options import ShardedOptions

        return ShardedOptions
    raise AttributeError(f"module 'asyncrl.trainers.distributed' has no attribute {name!r}")
