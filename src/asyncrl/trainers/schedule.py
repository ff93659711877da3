"""``policy.scheduler`` built on torch's own ``lr_scheduler`` classes.

The schedule advances once per training step, after the step's optimizer steps
(which share one learning rate): ``total_iters``, ``milestones`` and
``decay_steps`` count training steps.

Resume: the learning rate at step k is a pure function of the base rate
(``policy.optimizer.lr``, from the config) and k. So a resumed trainer builds
the schedule afresh over the config's base rate and advances it to the
checkpoint's step - the uninterrupted run's rates exactly, and a base rate
changed on resume takes effect with the schedule re-applied from that step
(the checkpoint holds no scheduler state that could disagree with the config).
"""

from __future__ import annotations

import difflib
import math
import pkgutil
import warnings
from typing import Any

import torch
from torch.optim import lr_scheduler

from asyncrl.config.schedule import (
    MilestonesConfig,
    SchedulerConfig,
    TorchSchedulerConfig,
    WarmupDecayConfig,
)
from asyncrl.errors import ConfigError


def build_scheduler(optimizer: torch.optim.Optimizer,
                    cfg: SchedulerConfig | None) -> lr_scheduler.LRScheduler | None:
    """The scheduler ``cfg`` describes over ``optimizer`` (whose param groups hold
    the base rate), at step 0; None for a constant rate."""
    if cfg is None:
        return None
    for group in optimizer.param_groups:
        group["initial_lr"] = group["lr"]  # the base the schedulers multiply
    if isinstance(cfg, TorchSchedulerConfig):
        return _torch_one(optimizer, cfg)
    if isinstance(cfg, WarmupDecayConfig):
        return _warmup_decay(optimizer, cfg)
    named = [e for e in cfg if isinstance(e, TorchSchedulerConfig)]
    marks = next(e for e in cfg if isinstance(e, MilestonesConfig)).milestones
    parts = [_torch_one(optimizer, e) for e in named]
    return lr_scheduler.SequentialLR(optimizer, parts, milestones=list(marks))


def _torch_one(optimizer: torch.optim.Optimizer,
               cfg: TorchSchedulerConfig) -> lr_scheduler.LRScheduler:
    cls = pkgutil.resolve_name(cfg.name)
    return cls(optimizer, **cfg.kwargs)


def _warmup_decay(optimizer: torch.optim.Optimizer,
                  cfg: WarmupDecayConfig) -> lr_scheduler.LRScheduler:
    warmup = (lr_scheduler.LinearLR(optimizer, start_factor=cfg.warmup_start_factor,
                                    end_factor=1.0, total_iters=cfg.warmup_steps)
              if cfg.warmup_steps > 0 else None)
    decay: lr_scheduler.LRScheduler
    if cfg.decay == "constant":
        decay = lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)
    elif cfg.decay == "linear":
        decay = lr_scheduler.LinearLR(optimizer, start_factor=1.0, end_factor=cfg.min_lr_ratio,
                                      total_iters=cfg.decay_steps)
    else:
        floor = cfg.min_lr_ratio
        steps = cfg.decay_steps or 1
        decay = lr_scheduler.LambdaLR(optimizer, lambda k: floor + (1 - floor) * 0.5 * (
            1 + math.cos(math.pi * min(k, steps) / steps)))
    if warmup is None:
        return decay
    return lr_scheduler.SequentialLR(optimizer, [warmup, decay], milestones=[cfg.warmup_steps])


def advanced(optimizer: torch.optim.Optimizer, cfg: SchedulerConfig | None,
             steps: int) -> lr_scheduler.LRScheduler | None:
    """:func:`build_scheduler` advanced ``steps`` training steps (a resume)."""
    scheduler = build_scheduler(optimizer, cfg)
    if scheduler is not None:
        with warnings.catch_warnings():
            # torch warns of a scheduler stepped before its optimizer: here the
            # optimizer's steps are the checkpoint's, already taken.
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(steps):
                scheduler.step()
    return scheduler


def check_schedule(cfg: SchedulerConfig | None, lr: float = 1.0) -> None:
    """Build the schedule over a one-parameter optimizer and step it once: a
    class torch does not have, a keyword it refuses, or one its first step
    fails on is a :class:`ConfigError` naming ``policy.scheduler``."""
    if cfg is None:
        return
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    try:
        scheduler = build_scheduler(optimizer, cfg)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"policy.scheduler: {exc}; name one of torch.optim.lr_scheduler's "
                          f"classes, {_closest_scheduler(cfg)}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"policy.scheduler: {exc}; check its kwargs "
                          "against torch.optim.lr_scheduler's signature") from None
    # Some keywords torch takes are refused only by the first step (StepLR's
    # step_size=0 divides by zero there): one step here, on the throwaway
    # optimizer, makes that a config error before the run, not a crash after
    # its first training step.
    optimizer.step()
    try:
        assert scheduler is not None
        scheduler.step()
    except Exception as exc:
        raise ConfigError(f"policy.scheduler: its first step raised {type(exc).__name__}: "
                          f"{exc}; check its kwargs against torch.optim.lr_scheduler's "
                          "documentation (a step size or period of 0, say)") from None


def _closest_scheduler(cfg: SchedulerConfig) -> str:
    """"did you mean ..." for the first entry torch does not have (a typo such as
    ``LinearLr`` is the usual cause), else an example."""
    entries = cfg if isinstance(cfg, list) else [cfg]
    known = [n for n, v in vars(lr_scheduler).items()
             if isinstance(v, type) and issubclass(v, lr_scheduler.LRScheduler)
             and not n.startswith("_")]
    for entry in entries:
        if not isinstance(entry, TorchSchedulerConfig):
            continue
        short = entry.name.rsplit(".", 1)[-1]
        if short in known:
            continue
        close = difflib.get_close_matches(short, known, n=1, cutoff=0.5)
        if close:
            return f"did you mean {lr_scheduler.__name__}.{close[0]}?"
    return "e.g. torch.optim.lr_scheduler.LinearLR"


def current_lr(optimizer: torch.optim.Optimizer) -> float:
    """The learning rate the next optimizer step uses (of the first param group)."""
    lr: Any = optimizer.param_groups[0]["lr"]
    return float(lr)


__all__ = ["advanced", "build_scheduler", "check_schedule", "current_lr"]
