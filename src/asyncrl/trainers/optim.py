"""The optimizer's hyper-parameters come from the run's config, also on resume.

``torch.optim.Optimizer.load_state_dict`` restores a checkpoint's param groups
whole, hyper-parameters included: a run resumed with ``policy.optimizer.lr``
changed would silently train on with the checkpoint's learning rate. So every
trainer that loads an optimizer state calls :func:`apply_optimizer_config`
right after it (the single-process trainer and every rank of the sharded one):
the moments and step counts come from the checkpoint, the hyper-parameters from
the config. A learning-rate schedule is then rebuilt over the config's rate and
advanced to the resumed step (:func:`asyncrl.trainers.schedule.advanced`).

``grad_clip`` is not an optimizer hyper-parameter: the trainer reads it from the
config at every step, so a change applies on resume anyway.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from asyncrl.config import OptimizerConfig

log = logging.getLogger("asyncrl.trainers")


def hyperparameters(cfg: OptimizerConfig) -> dict[str, Any]:
    """AdamW's keyword arguments (its param-group keys) that the config sets."""
    return {"lr": cfg.lr, "betas": tuple(cfg.betas), "weight_decay": cfg.weight_decay}


def apply_optimizer_config(optimizer: torch.optim.Optimizer, cfg: OptimizerConfig) -> list[str]:
    """Set ``cfg``'s hyper-parameters on every param group of ``optimizer`` (a
    loaded one: its state stays); returns what changed, e.g. ``["lr 0.0007 ->
    0.05"]``, and logs it."""
    changes: dict[str, str] = {}
    for group in optimizer.param_groups:
        for key, value in hyperparameters(cfg).items():
            old = group.get(key)
            if _differs(old, value):
                changes[key] = f"{key} {_shown(old)} -> {_shown(value)}"
            group[key] = value
    if changes:
        log.info("optimizer hyper-parameters from the config, applied over the restored "
                 "optimizer's: %s", ", ".join(changes.values()))
    return list(changes.values())


def _differs(old: Any, new: Any) -> bool:
    if isinstance(old, torch.Tensor):  # a tensor lr (torch allows it)
        old = old.tolist()
    return (tuple(old) if isinstance(old, (list, tuple)) else old) != new


def _shown(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(f"{v:g}" for v in value) + ")"
    return f"{value:g}" if isinstance(value, float) else str(value)


__all__ = ["apply_optimizer_config", "hyperparameters"]
