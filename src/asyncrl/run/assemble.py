"""The library's two ways to train, re-exported as ``asyncrl.train`` and
``asyncrl.build_controller`` (docs/design.md, "The public face").

* :func:`train` is ``asyncrl train`` from Python: the same checks, the run
  directory, checkpoints, the final policy and the summary it returns.
* :func:`build_controller` is an ``async with`` around the controller
  ``asyncrl train`` would run, for a script that wants none of the run
  directory: it builds what the caller did not hand in and closes what it built.

Both take the config as a :class:`~asyncrl.config.RunConfig`, a dict or the
path of a YAML file, with config keys as keyword overrides (``__`` for each
dot, :func:`~asyncrl.config.resolve_config`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import ConfigSource, resolve_config
from asyncrl.controller import Controller, RunDirSummary
from asyncrl.errors import UsageError
from asyncrl.rollouts import apply_rollout
from asyncrl.run.backends import build_backends, own_backend
from asyncrl.run.preflight import preflight
from asyncrl.run.resume_run import resume_run
from asyncrl.run.rundir import PYTHON
from asyncrl.run.train import train as run_train
from asyncrl.tasks import build_scorer

if TYPE_CHECKING:
    from asyncrl.buffer import RolloutBuffer
    from asyncrl.controller import LedgerHistory
    from asyncrl.controller.controller import StepHook
    from asyncrl.controller.evaluation import Evaluator
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.metrics import MetricsSink
    from asyncrl.sampling import PromptGroupSampler
    from asyncrl.tasks.base import PromptSource, Scorer, Task
    from asyncrl.trainers.base import Trainer

__all__ = ["build_controller", "train"]

log = logging.getLogger("asyncrl.assemble")


def train(
    config: ConfigSource | None = None,
    *,
    run_dir: str | Path | None = None,
    resume: str | Path | None = None,
    task: Task | None = None,
    engines: Sequence[RolloutEngine] | None = None,
    trainer: Trainer | None = None,
    sinks: Sequence[MetricsSink] = (),
    overwrite: bool = False,
    **overrides: Any,
) -> RunDirSummary | None:
    """Run async GRPO as ``asyncrl train --config ... key.path=value`` does; returns
    the summary it writes to ``run_dir/summary.json``.

    ``overrides``: config keys, ``__`` for each dot (``grpo__max_num_steps=20``);
    a bad one is a :class:`~asyncrl.errors.ConfigError` naming the field, before
    anything is built. ``run_dir``: a new or empty directory (default
    ``runs/train-<timestamp>``; ``overwrite`` starts an old run over). ``task``,
    ``engines`` with ``trainer`` (both or neither) replace what the config would
    build; the run closes them when it ends, as it closes its own. ``sinks``
    get every step's metrics besides the run's files. SIGINT and SIGTERM stop
    the run gracefully, as on the command line, and the summary's
    ``resume_command`` (also logged) continues it. Call it from synchronous code:
    it runs its own event loop (from ``async`` code, use :func:`build_controller`).

    ``resume``: instead of ``config``, the directory of a run to continue from its
    newest checkpoint, as ``asyncrl train --resume RUN`` does (``overrides`` on
    top of its config.yaml; ``run_dir``: fork it there). A run that got its
    ``task``, ``engines`` or ``trainer`` here must be resumed here, passing them
    again (:mod:`asyncrl.run.components`). Returns None when nothing is left to do.
    """
    _outside_a_loop()
    _both_or_neither(engines, trainer, "train")
    backends = None if engines is None or trainer is None else (list(engines), trainer)
    if resume is not None:
        if config is not None:
            raise UsageError("train: pass a config for a new run or resume=RUN_DIR to continue "
                             "one (it runs with that run's config.yaml), not both; change its "
                             "settings with keyword overrides")
        summary = resume_run(resume, _as_overrides(overrides), fork_to=run_dir,
                             overwrite=overwrite, task=task, backends=backends,
                             extra_sinks=sinks, spelling=PYTHON)
        if summary is None:
            return None
    else:
        if config is None:
            raise UsageError("train: pass a config (a RunConfig, a dict or a YAML path), or "
                             "resume=RUN_DIR to continue a run")
        summary = run_train(resolve_config(config, overrides), run_dir, task=task,
                            backends=backends, extra_sinks=sinks, overwrite=overwrite,
                            spelling=PYTHON)
    if summary.get("resume_command"):  # stopped before max_num_steps: the CLI prints it too
        command = summary["resume_command"]
        if (task is not None or backends is not None) and "--resume" in command:
            # Its components came from here: only a Python resume passes them again.
            passed = ", ".join(f"{name}=..." for name, value in
                               (("task", task), ("engines", engines), ("trainer", trainer))
                               if value is not None)
            command = f"asyncrl.train(resume={summary['run_dir']!r}, {passed})"
        log.warning("the run stopped before grpo.max_num_steps (%s); continue it with: %s",
                    summary["stop_reason"], command)
    return summary


@contextlib.asynccontextmanager
async def build_controller(
    config: ConfigSource,
    *,
    task: Task | None = None,
    engines: Sequence[RolloutEngine] | None = None,
    trainer: Trainer | None = None,
    work_dir: str | Path | None = None,
    sinks: Sequence[MetricsSink] = (),
    on_step_end: StepHook | None = None,
    scorer: Scorer | None = None,
    evaluator: Evaluator | None = None,
    ledger_history: LedgerHistory | None = None,
    buffer: RolloutBuffer | None = None,
    sampler: PromptGroupSampler | None = None,
    prompts: PromptSource | None = None,
    **overrides: Any,
) -> AsyncIterator[Controller]:
    """``async with build_controller(config) as controller: await controller.run()``:
    the controller ``asyncrl train`` would run for ``config``, after the same checks,
    without a run directory.

    ``overrides``: config keys, as for :func:`train`. ``task``, ``engines`` with
    ``trainer`` (both or neither), and the :class:`~asyncrl.controller.Controller`
    roles (``scorer``, ``sampler`` with its ``buffer``, ``prompts``, ...) replace
    what would be built from the config. On leaving the block - normally, on an
    error or on cancellation - everything built here is closed: the engines, the
    trainer, the reward pools. What the caller handed in is not: closing it stays
    the caller's. ``work_dir``: where a vLLM engine finds the model saved for it
    (a temporary directory when None).
    """
    cfg = resolve_config(config, overrides)
    _both_or_neither(engines, trainer, "build_controller")
    checked = preflight(cfg, task=task,
                        backends=None if engines is None or trainer is None
                        else (engines, trainer))
    for warning in checked.facts["warnings"]:  # as asyncrl train logs them
        log.warning("%s", warning)
    async with contextlib.AsyncExitStack() as owned:  # closed in the reverse order
        if checked.evaluator is not None:  # the checks built its reward pool
            own_backend(owned, checked.evaluator.scorer)
        if engines is None or trainer is None:
            engines, trainer = build_backends(cfg, checked.task, work_dir=work_dir,
                                              policy_tokenizer=checked.tokenizer)
            own_backend(owned, trainer)
            for engine in reversed(engines):  # the engines close before the trainer
                own_backend(owned, engine)
        if cfg.task.rollout is not None:  # each group runs the task's rollout function
            # The wrappers close the engine they wrap: only the engines are owned.
            engines = apply_rollout(cfg.task.rollout, engines,
                                    checked.tokenizer.get(checked.task))
        if scorer is None:
            scorer = own_backend(owned, build_scorer(checked.task, cfg.task))
        yield Controller(
            task=checked.task, engines=engines, trainer=trainer, grpo=cfg.grpo,
            async_rl=cfg.async_rl, seed=cfg.seed, deterministic=cfg.deterministic,
            sinks=sinks, on_step_end=on_step_end, scorer=scorer,
            evaluator=evaluator if evaluator is not None else checked.evaluator,
            ledger_history=ledger_history, buffer=buffer, sampler=sampler, prompts=prompts,
            vocab_size=checked.vocab_size,
        )


def _as_overrides(keywords: dict[str, Any]) -> list[str]:
    """Keyword overrides as the command line's ``key.path=value`` (JSON is YAML)."""
    return [f"{name.replace('__', '.')}={json.dumps(value)}" for name, value in keywords.items()]


def _both_or_neither(engines: Any, trainer: Any, entry: str) -> None:
    if (engines is None) != (trainer is None):
        raise UsageError(f"{entry}: pass engines= and trainer= together (or neither: both "
                         "are built from the config)")


def _outside_a_loop() -> None:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise UsageError("asyncrl.train runs an event loop of its own and cannot be called from "
                     "async code; there, use: async with asyncrl.build_controller(config) as "
                     "controller: await controller.run()")
