"""What the sharded trainer (``trainer.strategy: fsdp``) and each of its ranks are
built from: :class:`ShardedOptions`, made once by the run
(:mod:`asyncrl.run.options`) and sent to every rank as it is (it pickles)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from asyncrl.trainers.distributed.checks import collective_backend
from asyncrl.trainers.options import TrainerOptions

if TYPE_CHECKING:
    from asyncrl.config import LossConfig, PolicyConfig, TrainerConfig

__all__ = ["ShardedOptions"]


@dataclasses.dataclass(frozen=True)
class ShardedOptions:
    """The sharded trainer's settings, and those of the trainer on each rank."""

    #: The policy every rank builds: on the host in float32, then sharded onto
    #: its device in ``policy.dtype`` (``policy.device`` says which kind).
    policy: PolicyConfig
    #: The GRPO trainer each rank runs on its share of every chunk.
    rank_trainer: TrainerOptions
    #: Seeds the policy's initial weights: the same on every rank.
    seed: int = 0
    #: Rank processes (``trainer.world_size``).
    world_size: int = 1
    #: ``nccl`` or ``gloo``: ``trainer.backend``, with ``auto`` resolved for ``policy.device``.
    backend: str = "gloo"
    #: A collective waiting longer than this for a rank fails (``trainer.collective_timeout_s``).
    collective_timeout_s: float = 600.0

    @classmethod
    def of(cls, *, policy: PolicyConfig, loss: LossConfig, trainer: TrainerConfig,
           seed: int = 0, deterministic: bool = False) -> ShardedOptions:
        """The options of the ``policy``, ``loss`` and ``trainer`` blocks."""
        return cls(
            policy=policy,
            rank_trainer=TrainerOptions.of(policy, loss, deterministic=deterministic),
            seed=seed,
            world_size=trainer.world_size,
            backend=collective_backend(trainer, policy.device),
            collective_timeout_s=trainer.collective_timeout_s,
        )
