"""A controller for a run config, from the pieces a library user hands in and
the defaults ``asyncrl train`` builds for the others.

``asyncrl train`` adds a run directory, checkpoints and metrics files around
the same controller (:mod:`asyncrl.runner`); a script that wants none of that
builds the controller here and awaits ``controller.run()``
(``examples/minimal_async_grpo.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.backends import build_backends
from asyncrl.controller import Controller
from asyncrl.errors import UsageError
from asyncrl.preflight import preflight

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.base import Trainer

__all__ = ["build_controller"]


def build_controller(
    cfg: RunConfig,
    *,
    task: Task | None = None,
    engines: Sequence[RolloutEngine] | None = None,
    trainer: Trainer | None = None,
    work_dir: str | Path | None = None,
    **instances: Any,
) -> Controller:
    """The controller ``asyncrl train`` would run for ``cfg``, after the same checks.

    ``task``, ``engines`` with ``trainer`` (both or neither), and the
    :class:`~asyncrl.controller.Controller` keywords in ``instances`` (``sampler``
    with its ``buffer``, ``scorer``, ``prompts``, ``sinks``, ...) replace what
    would be built from ``cfg``. The caller closes the engines and the trainer
    after the run (``await engine.close()``, ``await trainer.close()``).
    """
    if (engines is None) != (trainer is None):
        raise UsageError("build_controller: pass engines= and trainer= together (or neither: "
                         "both are built from cfg)")
    checked = preflight(cfg, task=task, builtin_backends=engines is None)
    if engines is None:
        engines, trainer = build_backends(cfg, checked.task, work_dir=work_dir)
    assert trainer is not None
    instances.setdefault("evaluator", checked.evaluator)
    return Controller(task=checked.task, engines=engines, trainer=trainer, grpo=cfg.grpo,
                      async_rl=cfg.async_rl, seed=cfg.seed, deterministic=cfg.deterministic,
                      **instances)
