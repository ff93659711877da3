"""How a run ends in its run directory: the summary, timeline, ledger and plots
(:func:`finish_run_dir`), and what to run next (:func:`resume_command`,
:func:`error_resume_hint`, :func:`final_note`).

An error that stopped the run at a safe point has a final checkpoint of the
state it stopped in (``asyncrl.run.train``); any other error (the trainer
raising inside a step, whose state may be half-updated) has none of its own:
the run resumes from the newest checkpoint before it, or, without one, starts
over. A failed run exports no ``final/`` either way: its policy is not the
outcome of the run that was asked for, and the checkpoint keeps its weights.
"""

from __future__ import annotations

import logging
from pathlib import Path

from asyncrl._util.jsonio import write_json
from asyncrl.checkpoint.store import list_checkpoints
from asyncrl.config import RunConfig
from asyncrl.controller import Controller, JsonlHistory, RunDirSummary
from asyncrl.metrics.report import write_plots
from asyncrl.tasks import Task
from asyncrl.types import StopReason

log = logging.getLogger("asyncrl.runner")

#: Stop reasons after which the run's state is whole and worth a final checkpoint.
CHECKPOINTED_ENDS = (StopReason.MAX_NUM_STEPS, StopReason.SOURCE_EXHAUSTED,
                     StopReason.INCOMPLETE_STEP, StopReason.INTERRUPTED, StopReason.TERMINATED,
                     StopReason.STALLED, StopReason.SAVE_BY)
#: Stop reasons whose summary carries the command that resumes the run (an
#: error's: from its checkpoint, or the newest one before it).
RESUMABLE_ENDS = (StopReason.INTERRUPTED, StopReason.TERMINATED, StopReason.STALLED,
                  StopReason.SAVE_BY, StopReason.ERROR)


def resume_command(run_dir: Path) -> str:
    """The command that continues the run in ``run_dir``: from its newest
    checkpoint, or (it has none: it stopped before its first one) the command
    that starts it over in its directory."""
    if list_checkpoints(run_dir):
        return f"asyncrl train --resume {run_dir}"
    return f"asyncrl train --config {run_dir / 'config.yaml'} --run-dir {run_dir} --overwrite"


def error_resume_hint(run_dir: Path) -> str:
    """The note on an error that stopped the run where its state may be
    half-updated (not checkpointed): what there is to resume from."""
    found = list_checkpoints(run_dir)
    if found:
        return (f"the step the error hit is not checkpointed; the newest checkpoint is "
                f"{found[0].name} (the steps after it are trained again): after fixing the "
                f"cause, resume with: {resume_command(run_dir)}")
    return ("no checkpoint was written before the error, so there is nothing to resume: "
            f"after fixing the cause, start again with: {resume_command(run_dir)}")


def final_note(run_dir: Path, *, failed: bool, forced: bool = False) -> str:
    """Why ``run_dir`` has no ``final/`` (``summary.json``'s ``final_note``, the
    ``final policy`` line of the printed summary and a note on a run's error),
    and what writes the weights instead: ``asyncrl export`` of a checkpoint."""
    if failed:
        why = "the run stopped with an error"
    elif forced:
        why = "the run was stopped at once"
    else:
        why = "the export failed: the warning above says why"
    found = list_checkpoints(run_dir)
    if not found:
        return f"not exported ({why}), and there is no checkpoint to export"
    return (f"not exported ({why}); export its newest checkpoint, {found[0].name}, with: "
            f"asyncrl export {run_dir} --out DIR")


def finish_run_dir(run_dir: Path, controller: Controller, task: Task, cfg: RunConfig,
                   summary: RunDirSummary, *, plots: bool = True) -> RunDirSummary:
    """Write summary.json, timeline.json, the pending groups' ledger lines and the plots."""
    target = task.target_reward  # a required member (the pre-run checks refuse a task without)
    summary["target_reward"] = target
    last10 = summary.get("reward_last10_mean")
    summary["reached_target"] = bool(
        target is not None and last10 is not None and last10 == last10 and last10 >= target
    )
    summary["run_dir"] = str(run_dir)
    if summary["stop_reason"] in RESUMABLE_ENDS:
        summary["resume_command"] = resume_command(run_dir)
    # NaN (e.g. the reward of a run without steps) is written as null: JSON has no NaN.
    write_json(run_dir / "summary.json", summary, indent=2, default=str)
    write_json(run_dir / "timeline.json", controller.timeline.to_list())
    # ledger.jsonl already holds every finished group; add the pending ones, so
    # the file has one line per prompt group ever dispatched.
    history = controller.ledger.history
    if isinstance(history, JsonlHistory):
        for rec in controller.ledger.live_records():
            history.append_pending(rec)
        history.close()
    if plots and cfg.logging.plots and controller.steps_done:
        try:
            summary["plots"] = [str(p) for p in write_plots(run_dir)]
        except Exception as exc:  # plots are a convenience: never lose the summary over them
            log.warning("could not draw plots: %r", exc)
    return summary
