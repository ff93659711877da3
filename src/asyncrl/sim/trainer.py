"""The simulated trainer: the real :class:`~asyncrl.trainers.Trainer` protocol,
with time instead of work (see :mod:`asyncrl.sim.backends`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from asyncrl.config import LossConfig
from asyncrl.sim.tokens import count_masked_chunk
from asyncrl.trainers.masks import MaskStats
from asyncrl.types import Rollout


class SimTrainer:
    """``train_per_group_s`` per group and ``train_per_token_s`` per completion
    token in every chunk, ``train_step_s`` per optimizer step.

    Implements :class:`asyncrl.trainers.Trainer`. The weights it hands out are
    just the version number (the engine only needs to know when they arrive).
    It applies ``loss`` (``max_token_staleness``, ``truncated: mask``) as the
    real trainer does, and counts the tokens its masks exclude (``mask_stats``).
    """

    def __init__(self, *, train_step_s: float, train_per_group_s: float = 0.0,
                 train_per_token_s: float = 0.0, loss: LossConfig | None = None) -> None:
        self.train_step_s = train_step_s
        self.train_per_group_s = train_per_group_s
        self.train_per_token_s = train_per_token_s
        self.loss = loss if loss is not None else LossConfig()
        self.mask_stats = MaskStats()
        self.steps = 0
        self.groups = 0
        self.busy_s = 0.0

    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        self.groups += len(rollouts)
        stats = MaskStats()
        count_masked_chunk(rollouts, step=step, cfg=self.loss, stats=stats)
        total = self.mask_stats
        total.tokens += stats.tokens
        total.masked += stats.masked
        total.completions += stats.completions
        total.truncated += stats.truncated
        cost = self.train_per_group_s * len(rollouts) + self.train_per_token_s * stats.tokens
        if cost > 0:
            self.busy_s += cost
            await asyncio.sleep(cost)
        return {**stats.metrics(), "num_tokens": float(stats.tokens)}

    async def finish_step(self, *, step: int) -> dict[str, float]:
        if self.train_step_s > 0:
            self.busy_s += self.train_step_s
            await asyncio.sleep(self.train_step_s)
        self.steps += 1
        return {}

    async def get_weights(self) -> Any:
        return self.steps

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "groups": self.groups}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.steps = int(state["steps"])
        self.groups = int(state["groups"])

    async def close(self) -> None:
        return None
