"""Trainers: the protocol, the built-in GRPO trainer and the options it is built from.

``GRPOTrainer`` is imported on first use, so that importing the protocol does
not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.trainers.base import Trainer
from asyncrl.trainers.options import TrainerOptions

if TYPE_CHECKING:
    from asyncrl.trainers.grpo import GRPOTrainer

__all__ = ["GRPOTrainer", "Trainer", "TrainerOptions"]


def __getattr__(name: str) -> Any:
    if name == "GRPOTrainer":
        from asyncrl.trainers.grpo import GRPOTrainer

        return GRPOTrainer
    raise AttributeError(f"module 'asyncrl.trainers' has no attribute {name!r}")
