"""``train``: build the backends a config names, run the controller, write the run dir.

The run directory (DESIGN.md §6): ``config.yaml``, ``metrics.jsonl``,
``summary.json``, ``timeline.json``, TensorBoard events under ``tb/`` and PNG
plots under ``plots/``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl._yaml import load_yaml
from asyncrl.backends import build_backends
from asyncrl.checkpoint import (
    CheckpointHook,
    LoadedCheckpoint,
    config_changes,
    iter_checkpoints,
    prepare_resume,
)
from asyncrl.checkpoint.resume import ENGINE_SNAPSHOTS
from asyncrl.checkpoint.store import set_aside_newer
from asyncrl.config import RunConfig, config_from_dict, dump_config
from asyncrl.controller import Controller
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import CheckpointError, ConfigError
from asyncrl.jsonio import dumps, write_json
from asyncrl.metrics import JsonlSink, MetricsSink, TensorBoardSink
from asyncrl.metrics.progress import progress_sink
from asyncrl.metrics.report import write_plots
from asyncrl.preflight import preflight
from asyncrl.rundir import check_run_dir, fork_run_dir, prepare_run_dir, truncate_metrics
from asyncrl.tasks import Task
from asyncrl.trainers.base import Trainer

log = logging.getLogger("asyncrl.runner")


def train(
    cfg: RunConfig,
    run_dir: str | Path | None = None,
    *,
    task: Task | None = None,
    backends: tuple[Sequence[RolloutEngine], Trainer] | None = None,
    extra_sinks: Sequence[MetricsSink] = (),
    resume: LoadedCheckpoint | None = None,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run async GRPO as configured; returns the summary written to ``summary.json``.

    ``task`` and ``backends`` let library users plug in their own task, engines
    or trainer (built-ins are built from ``cfg`` otherwise). A new run refuses a
    ``run_dir`` that holds anything, unless ``overwrite`` (an old run directory
    is then emptied of its run files). ``resume`` continues from a loaded
    checkpoint: in its own run directory, or forked into another, new
    ``run_dir``; a checkpoint that does not load falls back to an older one.
    """
    home = resume.path.parent.parent if resume is not None else None
    fresh = home is None or (run_dir is not None and Path(run_dir).resolve() != home.resolve())
    run_dir = check_run_dir(run_dir, overwrite=overwrite) if fresh else home
    # Every pre-run check, before anything is written (asyncrl validate runs the same).
    task = preflight(cfg, task=task, builtin_backends=backends is None).task
    if fresh:  # a new run, or a fork of ``resume`` into a run directory of its own
        prepare_run_dir(run_dir, overwrite=overwrite)
    engines, trainer = backends if backends is not None else build_backends(cfg, task)
    try:
        snapshots = None
        if resume is not None:
            resume, snapshots = _restore(cfg, task, engines, trainer, resume, run_dir)
        (run_dir / "config.yaml").write_text(dump_config(cfg))
        controller = _controller(cfg, task, engines, trainer, run_dir, resume, extra_sinks)
    except BaseException:
        asyncio.run(_close(engines, trainer))
        raise
    start = resume.step if resume is not None else 0

    async def main() -> None:
        try:
            if resume is not None:
                # The engines start from the checkpoint's weights, at its version.
                weights = await trainer.get_weights()
                await asyncio.gather(*(e.update_weights(weights, start) for e in engines))
                for engine in engines:
                    if snapshots and hasattr(engine, "restore_retained"):
                        engine.restore_retained(snapshots)
            await controller.run()
            await end_of_run(run_dir, controller)
        finally:
            await _close(engines, trainer)

    interrupted = False
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        summary = finish_run_dir(run_dir, controller, task, cfg, interrupted=interrupted)
    return summary


#: Stop reasons of a run that ended as configured (not by an error or a signal).
NORMAL_ENDS = ("max_num_steps", "source_exhausted", "incomplete_step")


async def end_of_run(run_dir: Path, controller: Controller) -> None:
    """Everything a run that ended normally leaves for later, in one place.

    The final checkpoint: always written, whether or not ``max_num_steps`` is a
    multiple of ``checkpoint.every_steps`` and also when that is 0, so every
    finished run can be extended with ``--resume``. The final weights
    (``RUN_DIR/final/``, Hugging Face format) belong here too, next to it. A run
    that failed or was interrupted writes neither: its state may be torn.
    """
    if controller.stop_reason not in NORMAL_ENDS:
        return
    hook = controller.on_step_end
    if isinstance(hook, CheckpointHook):
        await hook.write_final(controller)


def _controller(cfg: RunConfig, task: Task, engines: Sequence[RolloutEngine], trainer: Trainer,
                run_dir: Path, resume: LoadedCheckpoint | None,
                extra_sinks: Sequence[MetricsSink] = ()) -> Controller:
    """The run's controller with its sinks and checkpoint hook, restored from ``resume``."""
    start = resume.step if resume is not None else 0
    if resume is not None:
        # Steps after the checkpoint were logged by the run that died; they are
        # trained again now, so their old records go.
        truncate_metrics(run_dir / "metrics.jsonl", before_step=start)
    sinks: list[MetricsSink] = [JsonlSink(run_dir / "metrics.jsonl", append=resume is not None)]
    if cfg.logging.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb", purge_step=start if resume else None))
    progress = progress_sink(cfg.logging.progress, cfg.grpo.max_num_steps, start_step=start,
                             every_s=cfg.logging.progress_every_s)
    if progress is not None:
        sinks.append(progress)
    sinks.extend(extra_sinks)
    controller = Controller(
        task=task, engines=engines, trainer=trainer, grpo=cfg.grpo, async_rl=cfg.async_rl,
        seed=cfg.seed, deterministic=cfg.deterministic, sinks=sinks,
        on_step_end=CheckpointHook(run_dir, cfg),
    )
    if resume is not None:
        controller.load_state_dict(resume.controller_state)
    return controller


def _restore(cfg: RunConfig, task: Task, engines: Sequence[RolloutEngine], trainer: Trainer,
             resume: LoadedCheckpoint, run_dir: Path) -> tuple[LoadedCheckpoint, Any]:
    """Load ``resume`` into the trainer (and a trial controller); when its content
    does not fit, fall back to older checkpoints of the same run, one warning each.

    Returns the checkpoint used and the engine snapshots it holds. A fork
    (``run_dir`` is not the checkpoint's run) gets a copy of that checkpoint.
    """
    source = resume.path.parent.parent
    problems: list[str] = []
    for ckpt in itertools.chain([resume], iter_checkpoints(source, older_than=resume.step)):
        trainer_state = dict(ckpt.trainer_state)
        snapshots = trainer_state.pop(ENGINE_SNAPSHOTS, None)
        try:
            trainer.load_state_dict(trainer_state)
            Controller(task=task, engines=engines, trainer=trainer, grpo=cfg.grpo,
                       async_rl=cfg.async_rl, seed=cfg.seed,
                       deterministic=cfg.deterministic).load_state_dict(ckpt.controller_state)
        except ConfigError:
            raise  # the config is wrong, not the checkpoint: the message says what to fix
        except Exception as exc:
            note = (f"checkpoint {ckpt.path.name} does not fit this run "
                    f"({type(exc).__name__}: {exc}); falling back to an older one")
            log.warning("%s", note)
            problems.append(note)
            continue
        if problems:
            log.warning("resuming from %s (trainer version %d) instead", ckpt.path.name, ckpt.step)
        if source.resolve() != run_dir.resolve():
            fork_run_dir(source, run_dir, ckpt.path)
        else:
            set_aside_newer(run_dir, ckpt.step)
        return ckpt, snapshots
    raise CheckpointError(
        f"no checkpoint of {source} can be loaded: " + "; ".join(problems)
        + ". Start a new run, or restore a checkpoint directory from a backup"
    )


async def _close(engines: Sequence[RolloutEngine], trainer: Trainer) -> None:
    for backend in (*engines, trainer):
        try:
            await backend.close()
        except Exception as exc:  # a failing close must not hide the run's outcome
            log.warning("closing %s failed: %r", type(backend).__name__, exc)


def finish_run_dir(run_dir: Path, controller: Controller, task: Task, cfg: RunConfig, *,
                   interrupted: bool = False) -> dict[str, Any]:
    """Write summary.json, timeline.json and the plots (also after an error)."""
    summary = controller.summary()
    if interrupted:
        summary["stop_reason"] = "interrupted"
    target = getattr(task, "target_reward", None)
    summary["target_reward"] = target
    last10 = summary.get("reward_last10_mean")
    summary["reached_target"] = bool(
        target is not None and last10 is not None and last10 == last10 and last10 >= target
    )
    summary["run_dir"] = str(run_dir)
    # NaN (e.g. the reward of a run without steps) is written as null: JSON has no NaN.
    write_json(run_dir / "summary.json", summary, indent=2, default=str)
    write_json(run_dir / "timeline.json", controller.timeline.to_list())
    # One line per prompt group: its whole life (the ledger), for audits.
    with (run_dir / "ledger.jsonl").open("w") as fh:
        for rec in controller.ledger.records():
            fh.write(dumps(rec.to_dict(), default=str) + "\n")
    if cfg.logging.plots and controller.steps_done:
        try:
            summary["plots"] = [str(p) for p in write_plots(run_dir)]
        except Exception as exc:  # plots are a convenience: never lose the summary over them
            log.warning("could not draw plots: %r", exc)
    return summary


def resume_run(run_dir: str | Path, overrides: list[str], *, fork_to: str | Path | None = None,
               overwrite: bool = False) -> dict[str, Any] | None:
    """``asyncrl train --resume RUN_DIR [--run-dir NEW]``: continue from the newest
    valid checkpoint, in place or forked into ``fork_to`` (RUN_DIR is then not
    changed). Returns None, changing nothing, when there is nothing left to do."""
    run_dir = Path(run_dir)
    cfg, ckpt = prepare_resume(run_dir, overrides)
    idle = nothing_to_do(run_dir, ckpt, cfg)
    if idle is not None:
        print(idle)
        return None
    target = run_dir
    if fork_to is not None and Path(fork_to).resolve() != run_dir.resolve():
        target = check_run_dir(fork_to, overwrite=overwrite)  # train prepares it
    saved = config_from_dict(load_yaml(ckpt.config_yaml, "checkpoint config"))
    changes = config_changes(saved, cfg)
    if changes:
        print("asyncrl: settings changed since the checkpoint (config.yaml edits or "
              "overrides):\n  " + "\n  ".join(changes))
    if target is not run_dir:
        print(f"asyncrl: forking {run_dir} at {ckpt.path.name} (trainer version {ckpt.step}) "
              f"into {target}; {run_dir} is not changed")
    else:
        print(f"asyncrl: resuming {run_dir} from {ckpt.path.name} (trainer version {ckpt.step})")
    return train(cfg, target, resume=ckpt, overwrite=overwrite)


def nothing_to_do(run_dir: Path, ckpt: LoadedCheckpoint, cfg: RunConfig) -> str | None:
    """Why resuming ``ckpt`` would train nothing (None: it would train)."""
    steps = cfg.grpo.max_num_steps
    at = f"{run_dir} is at step {ckpt.step} (its newest checkpoint, {ckpt.path.name})"
    state = ckpt.controller_state
    if ckpt.step >= steps:
        where = ("has reached it" if ckpt.step == steps
                 else "is below it (a lower max_num_steps does not undo steps)")
        return (
            f"asyncrl: nothing to do: {at} and grpo.max_num_steps={steps} {where}. Nothing "
            f"was changed. To train further, raise it, e.g.:\n"
            f"  asyncrl train --resume {run_dir} grpo.max_num_steps={ckpt.step + max(steps, 10)}"
        )
    if state.get("source_exhausted") and not any(
            state.get(k) for k in ("source_held", "ready", "inflight", "awaiting_slot")):
        return (
            f"asyncrl: nothing to do: {at} and its task has no prompts left (task.num_prompts). "
            "Nothing was changed. Start a new run with more prompts to train further"
        )
    return None
