"""``train``: build the backends a config names, run the controller, write the run dir.

The run directory (DESIGN.md §6): ``config.yaml``, ``metrics.jsonl``,
``summary.json``, ``timeline.json``, TensorBoard events under ``tb/`` and PNG
plots under ``plots/``.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from asyncrl.backends import build_backends
from asyncrl.checkpoint import CheckpointHook, LoadedCheckpoint, prepare_resume
from asyncrl.checkpoint.resume import ENGINE_SNAPSHOTS
from asyncrl.config import RunConfig, dump_config
from asyncrl.controller import Controller
from asyncrl.engines.base import RolloutEngine
from asyncrl.metrics import JsonlSink, MetricsSink, TensorBoardSink
from asyncrl.metrics.report import write_plots
from asyncrl.tasks import Task, build_task
from asyncrl.trainers.base import Trainer

log = logging.getLogger("asyncrl.runner")


def new_run_dir(prefix: str = "train", base: str | Path = "runs") -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    path = Path(base) / f"{prefix}-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = Path(base) / f"{prefix}-{stamp}-{n}"
    return path


def _want_progress(mode: str) -> bool:
    if mode == "always":
        return True
    if mode == "never":
        return False
    return sys.stderr.isatty()


def train(
    cfg: RunConfig,
    run_dir: str | Path | None = None,
    *,
    task: Task | None = None,
    backends: tuple[Sequence[RolloutEngine], Trainer] | None = None,
    extra_sinks: Sequence[MetricsSink] = (),
    resume: LoadedCheckpoint | None = None,
) -> dict[str, Any]:
    """Run async GRPO as configured; returns the summary written to ``summary.json``.

    ``task`` and ``backends`` let library users plug in their own task, engines
    or trainer (built-ins are built from ``cfg`` otherwise). ``resume`` continues
    from a loaded checkpoint in the same run directory.
    """
    run_dir = Path(run_dir) if run_dir is not None else new_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(dump_config(cfg))
    task = task if task is not None else build_task(cfg.task)
    engines, trainer = (backends if backends is not None
                        else build_backends(cfg, task, work_dir=run_dir))

    start = resume.step if resume is not None else 0
    if resume is not None:
        # Steps after the checkpoint were logged by the run that died; they are
        # trained again now, so their old records go.
        truncate_metrics(run_dir / "metrics.jsonl", before_step=start)
    sinks: list[MetricsSink] = [JsonlSink(run_dir / "metrics.jsonl", append=resume is not None)]
    if cfg.logging.tensorboard:
        sinks.append(TensorBoardSink(run_dir / "tb", purge_step=start if resume else None))
    if _want_progress(cfg.logging.progress):
        from asyncrl.metrics.progress import ProgressSink

        sinks.append(ProgressSink(cfg.grpo.max_num_steps, start_step=start))
    sinks.extend(extra_sinks)

    controller = Controller(
        task=task, engines=engines, trainer=trainer, grpo=cfg.grpo, async_rl=cfg.async_rl,
        seed=cfg.seed, deterministic=cfg.deterministic, sinks=sinks,
        on_step_end=CheckpointHook(run_dir, cfg) if cfg.checkpoint.every_steps else None,
    )
    snapshots = None
    if resume is not None:
        trainer_state = dict(resume.trainer_state)
        snapshots = trainer_state.pop(ENGINE_SNAPSHOTS, None)
        trainer.load_state_dict(trainer_state)
        controller.load_state_dict(resume.controller_state)

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
        finally:
            for backend in (*engines, trainer):
                try:
                    await backend.close()
                except Exception as exc:  # a failing close must not hide the run's outcome
                    log.warning("closing %s failed: %r", type(backend).__name__, exc)

    interrupted = False
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        summary = finish_run_dir(run_dir, controller, task, cfg, interrupted=interrupted)
    return summary


def truncate_metrics(path: Path, *, before_step: int) -> None:
    if not path.is_file():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line).get("step", 0) < before_step]
    path.write_text("".join(line + "\n" for line in kept))


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
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (run_dir / "timeline.json").write_text(json.dumps(controller.timeline.to_list()))
    # One line per prompt group: its whole life (the ledger), for audits.
    with (run_dir / "ledger.jsonl").open("w") as fh:
        for rec in controller.ledger.records():
            fh.write(json.dumps(rec.to_dict(), default=str) + "\n")
    if cfg.logging.plots and controller.steps_done:
        try:
            summary["plots"] = [str(p) for p in write_plots(run_dir)]
        except Exception as exc:  # plots are a convenience: never lose the summary over them
            log.warning("could not draw plots: %r", exc)
    return summary


def resume_run(run_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """``asyncrl train --resume RUN_DIR``: continue from the newest valid checkpoint."""
    cfg, ckpt = prepare_resume(run_dir, overrides)
    print(f"asyncrl: resuming {run_dir} from {ckpt.path.name} (trainer version {ckpt.step})")
    return train(cfg, run_dir, resume=ckpt)
