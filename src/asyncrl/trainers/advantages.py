"""Advantages of one group's rewards (the rewards are shaped first: see
:func:`asyncrl.trainers.masks.shaped`).

``loss.baseline`` says what a completion's reward is compared with, and
``loss.scale`` what the difference is divided by:

* ``group_mean`` + ``group``: GRPO, ``(r_i - mean(r)) / (std(r) + eps)``
* ``group_mean`` + ``none``: Dr. GRPO, ``r_i - mean(r)``
* ``leave_one_out`` + ``none``: RLOO, ``r_i - mean(r_j, j != i)``, which is
  ``n / (n - 1) * (r_i - mean(r))``
* ``leave_one_out`` + ``group``: the RLOO difference divided by the group's std;
* ``scale: batch``: the centred reward divided by the std of all the step's
  rewards (:func:`step_advantages`).

The std is the population std of the whole group (divide by n). NeMo-RL's
leave-one-out std is the sample std of the *other* n - 1 rewards; asyncrl keeps
one std per group (docs/training.md, "Advantages", shows both on one group).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from asyncrl.config import LossConfig


def group_advantages(rewards: Tensor, *, scale: bool = True, eps: float = 1e-6,
                     leave_one_out: bool = False) -> Tensor:
    """Advantages of one group's ``rewards`` (along the last dimension).

    A group whose rewards are all equal gets A = 0 whatever the options: it
    carries no learning signal. A group of one has no leave-one-out baseline;
    it gets A = 0 too.
    """
    rewards = rewards.float()
    n = rewards.shape[-1]
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    if leave_one_out:
        centered = centered * (n / (n - 1)) if n > 1 else torch.zeros_like(centered)
    if not scale:
        return centered
    return centered / (rewards.std(dim=-1, keepdim=True, correction=0) + eps)


def advantages(rewards: Tensor, cfg: LossConfig) -> Tensor:
    """The advantages ``cfg`` (``loss.baseline``, ``loss.scale``) gives one group."""
    return group_advantages(rewards, scale=cfg.scale == "group",
                            leave_one_out=cfg.baseline == "leave_one_out")


def step_advantages(rewards: list[Tensor], cfg: LossConfig, eps: float = 1e-6) -> list[Tensor]:
    """The advantages of a step's groups (``rewards``: one tensor per group).
    ``scale: batch`` divides every group's centred rewards by the population std
    of all the step's rewards (TRL's ``scale_rewards: batch``): it needs the
    whole step, so the trainer holds a step's groups until it ends."""
    if cfg.scale != "batch":
        return [advantages(r, cfg) for r in rewards]
    centred = [group_advantages(r, scale=False, leave_one_out=cfg.baseline == "leave_one_out")
               for r in rewards]
    if not rewards:
        return centred
    std = torch.cat([r.float() for r in rewards]).std(correction=0)
    return [c / (std + eps) for c in centred]


__all__ = ["advantages", "group_advantages", "step_advantages"]
