"""Build the rollout engines and the trainer a run config names.

This is the one place that knows every backend: :mod:`asyncrl.policy` builds
models, :mod:`asyncrl.engines` and :mod:`asyncrl.trainers` wrap them, and the
runner (or a library user) calls :func:`build_backends`. Nothing below imports
this module, so the layers stay acyclic.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.engines.local import LocalEngine
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.base import Trainer
    from asyncrl.trainers.grpo import GRPOTrainer


def build_backends(cfg: RunConfig, task: Task) -> tuple[list[RolloutEngine], Trainer]:
    """The engines and the trainer for ``cfg.cluster.backend``."""
    if cfg.cluster.backend == "ray":
        from asyncrl.cluster import build_ray_backends

        return build_ray_backends(cfg, task)
    engine, trainer = build_local_backends(cfg, task)
    return [engine], trainer


def build_local_backends(cfg: RunConfig, task: Task) -> tuple[LocalEngine, GRPOTrainer]:
    """The in-process engine and trainer: one policy built once, the engine
    getting its own copy (it generates in a thread of its own while the trainer
    updates its weights)."""
    from asyncrl.engines.local import LocalEngine
    from asyncrl.policy import build_policy
    from asyncrl.trainers.grpo import GRPOTrainer

    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    engine_model = copy.deepcopy(model)
    engine = LocalEngine.from_config(cfg, model=engine_model, tokenizer=tokenizer)
    # Weights go straight to the engine's device (on a GPU, never through the host).
    trainer = GRPOTrainer.from_config(cfg, model=model, tokenizer=tokenizer,
                                      weights_device=engine.device)
    return engine, trainer
