"""The views the run's components are built from, made from its config.

Every component takes its own config block, or a small frozen view of the few
values it reads, named for what they mean (docs/design.md, "Where each part
lives"); the whole :class:`~asyncrl.config.RunConfig` stays in ``run/``,
``cli/`` and ``sim/``. This module makes the views that gather values from
several blocks, for the run (and for ``asyncrl validate``, the tests and the
benchmarks): each is the view's own ``of``, given the blocks it needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from asyncrl.engines.options import EngineOptions
from asyncrl.trainers.distributed.options import ShardedOptions
from asyncrl.trainers.options import TrainerOptions

if TYPE_CHECKING:
    from asyncrl.config import RunConfig

__all__ = ["engine_options", "sharded_options", "trainer_options"]


def trainer_options(cfg: RunConfig) -> TrainerOptions:
    """What every GRPO trainer of the run is built from besides its model."""
    return TrainerOptions.of(cfg.policy, cfg.loss, deterministic=cfg.deterministic)


def sharded_options(cfg: RunConfig) -> ShardedOptions:
    """What the sharded trainer (``trainer.strategy: fsdp``) and its ranks are built from."""
    return ShardedOptions.of(policy=cfg.policy, loss=cfg.loss, trainer=cfg.trainer,
                             seed=cfg.seed, deterministic=cfg.deterministic)


def engine_options(cfg: RunConfig, work_dir: str | Path | None = None) -> EngineOptions:
    """What every engine of the run is built from besides ``policy`` (``work_dir``:
    the run directory)."""
    return EngineOptions.of(cfg.policy, cfg.async_rl, seed=cfg.seed,
                            deterministic=cfg.deterministic, work_dir=work_dir)
