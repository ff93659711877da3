"""What a GRPO trainer is built from besides its model: :class:`TrainerOptions`.

The view holds the few settings of ``policy`` and ``loss`` the trainer reads,
named for what they do. A run makes it once (:mod:`asyncrl.run.options`) and
every trainer of the run is built from it: the in-process one, the Ray trainer
actor, each rank of the sharded trainer. It is a frozen dataclass of config
blocks and plain values, so it pickles to processes and actors as it is.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from asyncrl.config import LossConfig, OptimizerConfig

if TYPE_CHECKING:
    from asyncrl.config import LoraConfig, PolicyConfig

__all__ = ["TrainerOptions"]


@dataclasses.dataclass(frozen=True)
class TrainerOptions:
    """The settings a :class:`~asyncrl.trainers.grpo.GRPOTrainer` takes besides its
    model and tokenizer (see its docstring for what each one does)."""

    #: The loss: the off-policy correction, KL, token masks (``loss``).
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    #: AdamW's hyper-parameters (``policy.optimizer``).
    optimizer: OptimizerConfig = dataclasses.field(default_factory=OptimizerConfig)
    #: The engines' sampling temperature: tokens are scored under the
    #: distribution they were sampled from (``policy.generation.temperature``).
    temperature: float = 1.0
    #: Torch threads of the trainer's worker (``policy.num_threads``; None: torch's).
    num_threads: int | None = None
    #: Token budget of one forward/backward (``policy.train_micro_batch_tokens``).
    micro_batch_tokens: int = 8192
    #: Recompute activations in the backward pass (``policy.gradient_checkpointing``).
    gradient_checkpointing: bool = False
    #: Train low-rank adapters only (``policy.lora``; None: the whole model).
    lora: LoraConfig | None = None
    #: Train each step's groups together, in prompt order (the run's ``deterministic``).
    deterministic: bool = False

    @classmethod
    def of(cls, policy: PolicyConfig, loss: LossConfig, *,
           deterministic: bool = False) -> TrainerOptions:
        """The options of a policy block and a loss block."""
        return cls(
            loss=loss,
            optimizer=policy.optimizer,
            temperature=policy.generation.temperature,
            num_threads=policy.num_threads,
            micro_batch_tokens=policy.train_micro_batch_tokens,
            gradient_checkpointing=policy.gradient_checkpointing,
            lora=policy.lora,
            deterministic=deterministic,
        )
