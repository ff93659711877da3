"""``asyncrl train --resume RUN_DIR [--run-dir NEW]`` and ``asyncrl.train(resume=...)``:
continue a run from its newest valid checkpoint (:mod:`asyncrl.run.resume`
prepares it; :func:`asyncrl.run.train.train` runs it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from asyncrl.config import RunConfig, config_from_dict
from asyncrl.config.strict_yaml import load_yaml
from asyncrl.controller import RunDirSummary
from asyncrl.controller.autoplan import Planner
from asyncrl.engines.base import RolloutEngine
from asyncrl.metrics import MetricsSink
from asyncrl.run.lock import refuse_if_in_use
from asyncrl.run.resume import config_changes, nothing_to_do, prepare_resume
from asyncrl.run.rundir import COMMAND_LINE, Spelling, check_run_dir
from asyncrl.run.train import train
from asyncrl.tasks import Task
from asyncrl.trainers.base import Trainer


def resume_run(run_dir: str | Path, overrides: list[str], *, fork_to: str | Path | None = None,
               overwrite: bool = False,
               planner_factory: Callable[[RunConfig], Planner] | None = None,
               task: Task | None = None,
               backends: tuple[Sequence[RolloutEngine], Trainer] | None = None,
               extra_sinks: Sequence[MetricsSink] = (),
               spelling: Spelling = COMMAND_LINE,
               ) -> RunDirSummary | None:
    """Continue run ``run_dir`` from its newest valid checkpoint, in place or forked
    into ``fork_to`` (``run_dir`` is then not changed). ``task`` and ``backends``:
    the components the run got from Python, passed again (see
    :mod:`asyncrl.run.components`). Returns None, changing nothing, when there
    is nothing left to do."""
    run_dir = Path(run_dir)
    forking = fork_to is not None and Path(fork_to).resolve() != run_dir.resolve()
    if not forking:  # a live run there: refused before anything is announced
        refuse_if_in_use(run_dir)
    cfg, ckpt = prepare_resume(run_dir, overrides)
    idle = nothing_to_do(run_dir, ckpt, cfg)
    if idle is not None:
        print(idle)
        return None
    target = run_dir
    if forking:
        target = check_run_dir(fork_to, overwrite=overwrite, spelling=spelling)  # train prepares it
    saved = config_from_dict(load_yaml(ckpt.config_yaml, "checkpoint config"))
    changes = config_changes(saved, cfg)
    if changes:
        print("asyncrl: settings changed since the checkpoint (config.yaml edits or "
              "overrides):\n  " + "\n  ".join(changes))
        if any(c.startswith("policy.optimizer.") for c in changes):
            # asyncrl.trainers.optim.apply_optimizer_config, when the trainer loads.
            print("asyncrl: the optimizer resumes with the checkpoint's moments and these "
                  "hyper-parameters")
    if target is not run_dir:
        print(f"asyncrl: forking {run_dir} at {ckpt.path.name} (trainer version {ckpt.step}) "
              f"into {target}; {run_dir} is not changed")
    else:
        print(f"asyncrl: resuming {run_dir} from {ckpt.path.name} (trainer version {ckpt.step})")
    return train(cfg, target, resume=ckpt, overwrite=overwrite, planner_factory=planner_factory,
                 overrides=overrides, task=task, backends=backends, extra_sinks=extra_sinks,
                 spelling=spelling)


__all__ = ["resume_run"]
