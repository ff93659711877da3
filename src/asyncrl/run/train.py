"""``train``: build the backends a config names, run the controller, write the run dir.

The run directory (docs/design.md, "What a run writes"): ``config.yaml``, ``metrics.jsonl``,
``summary.json``, ``timeline.json``, ``ledger.jsonl``, TensorBoard events under
``tb/``, PNG plots under ``plots/``, checkpoints under ``checkpoints/`` and the
final policy in Hugging Face format under ``final/``.

A run ends in one of three ways, and each leaves the run directory whole:

* normally (``max_num_steps``, the prompts used up), on a first SIGINT /
  SIGTERM, a stall with ``stall_action: abort`` or the ``checkpoint.save_by``
  deadline (a graceful stop): a final checkpoint, ``final/``, the summary, the
  ledger and the plots; after a signal, a stall or the deadline, the command
  that resumes it;
* on an error a component reported at run time (a bug in an engine - its
  ``generate`` or its ``update_weights`` - or in the scorer, a failure budget
  used up): the pumps stop at a safe point, so a final checkpoint is written
  too, and the error says how to resume;
* on any other error (the trainer raising inside a step, whose state may then
  be half-updated): no checkpoint of that state; the summary (with the error as
  the stop reason and its first line as the message), the ledger; the newest
  periodic checkpoint stays, and the error says to resume from it (or that
  there is none). No ``final/`` after an error of either kind
  (:mod:`asyncrl.run.ending`);
* on a second signal (forced): the summary and the ledger, quickly; the newest
  complete checkpoint stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from asyncrl._util.jsonio import write_text_atomic
from asyncrl.checkpoint import CheckpointHook, LoadedCheckpoint, iter_checkpoints
from asyncrl.checkpoint.hook import ENGINE_SNAPSHOTS
from asyncrl.checkpoint.store import list_checkpoints, set_aside_newer
from asyncrl.config import RunConfig, dump_config
from asyncrl.controller import Controller, JsonlHistory, RunDirSummary
from asyncrl.controller.autoplan import Planner
from asyncrl.controller.evaluation import Evaluator
from asyncrl.controller.failure_log import weight_load_failed
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import AsyncRLError, CheckpointError, ConfigError, add_note
from asyncrl.metrics import JsonlSink, MetricsSink, TensorBoardSink
from asyncrl.metrics.progress import progress_sink
from asyncrl.policy.build import PolicyTokenizer
from asyncrl.rollouts import apply_rollout
from asyncrl.run.backends import build_backends, own_backend
from asyncrl.run.components import check_resume, given, record
from asyncrl.run.ending import (
    CHECKPOINTED_ENDS,
    error_resume_hint,
    final_note,
    finish_run_dir,
    resume_command,
)
from asyncrl.run.export import export_final
from asyncrl.run.fleet_channel import fleet_channel
from asyncrl.run.lock import run_dir_lock
from asyncrl.run.preflight import preflight
from asyncrl.run.resume import without_reuse
from asyncrl.run.rundir import (
    AUTOPILOT_FILE,
    COMMAND_LINE,
    Spelling,
    autopilot_files,
    check_run_dir,
    fork_run_dir,
    prepare_run_dir,
    truncate_metrics,
)
from asyncrl.run.signals import GracefulStop, Terminated, run_event_loop, sigterm_as_interrupt
from asyncrl.tasks import Task, build_scorer
from asyncrl.trainers.base import Trainer
from asyncrl.types import StopReason

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
    planner_factory: Callable[[RunConfig], Planner] | None = None,
    overrides: Sequence[str] = (),
    spelling: Spelling = COMMAND_LINE,
) -> RunDirSummary:
    """Run async GRPO as configured; returns the summary written to ``summary.json``.

    ``task`` and ``backends`` let library users plug in their own task, engines
    or trainer (built-ins are built from ``cfg`` otherwise). A new run refuses a
    ``run_dir`` that holds anything, unless ``overwrite`` (an old run directory
    is then emptied of its run files) or it holds a run that never trained a
    step. The run holds ``run_dir``'s lock (:mod:`asyncrl.run.lock`) from its
    first write to its end: another run there is refused, naming its pid.
    ``resume`` continues from a loaded checkpoint: in its own run directory, or
    forked into another, new ``run_dir``; a checkpoint that does not load falls
    back to an older one.
    SIGINT / SIGTERM stop the run gracefully (see :mod:`asyncrl.run.signals`).
    ``planner_factory`` builds the planner of the model-based autopilot modes
    from the config (``asyncrl train`` gives :class:`asyncrl.sim.planner.ModelPlanner`).
    ``overrides``: a resume's command-line overrides, for the command a stop
    during start-up suggests. ``spelling``: how errors name the arguments.
    """
    began = time.monotonic()  # start-up, reported in the summary, counts from here
    cfg = without_reuse(cfg) if resume else cfg  # resumed: the checkpoint's setting wins
    components = given(task, backends)  # what came from Python, not from cfg
    with sigterm_as_interrupt():
        home = resume.path.parent.parent if resume is not None else None
        if home is not None:
            check_resume(home, components)
        fresh = home is None or (run_dir is not None and Path(run_dir).resolve() != home.resolve())
        run_dir = (check_run_dir(run_dir, overwrite=overwrite, spelling=spelling) if fresh
                   else home)
        # Every pre-run check, before anything is written (asyncrl validate runs the same).
        checked = preflight(cfg, task=task, backends=backends)
        task, evaluator = checked.task, checked.evaluator
        pilot = cfg.async_rl.autopilot
        planner = (planner_factory(cfg) if planner_factory is not None and pilot.enabled
                   and pilot.mode != "aimd" else None)
        for warning in checked.facts.get("warnings", ()):
            log.warning("%s", warning)
        # One run at a time in a directory, for the whole run (see asyncrl.run.lock).
        with run_dir_lock(run_dir):
            try:
                if fresh:  # a new run, or a fork of ``resume``; checked again, under the lock
                    prepare_run_dir(run_dir, overwrite=overwrite, reuse=pilot.reuse,
                                    spelling=spelling)
                engines, trainer = (backends if backends is not None else build_backends(
                    cfg, task, work_dir=run_dir, policy_tokenizer=checked.tokenizer))
                if cfg.task.rollout is not None:  # each group runs the task's rollout function
                    engines = apply_rollout(cfg.task.rollout, engines, checked.tokenizer.get(task))
                run = _Run(cfg, run_dir, task, engines, trainer, evaluator, checked.tokenizer,
                           planner)
                run.began, run.vocab_size = began, checked.vocab_size
                try:
                    snapshots = None
                    if resume is not None:
                        resume, snapshots = _restore(cfg, task, engines, trainer, resume, run_dir,
                                                     planner)
                    write_text_atomic(run_dir / "config.yaml", dump_config(cfg))
                    record(run_dir, components)
                    run.build_controller(resume, extra_sinks)
                except BaseException:
                    asyncio.run(run.close())
                    raise
            except KeyboardInterrupt as stop:  # Ctrl-C while starting (vLLM takes minutes)
                add_note(stop, _start_again_hint(run_dir, cfg, overrides))
                raise
            return run.execute(resume, snapshots)


def _start_again_hint(run_dir: Path, cfg: RunConfig, overrides: Sequence[str]) -> str:
    """What to run after a stop during start-up: nothing was trained by this run.
    A resume's ``overrides`` reach the run's config.yaml just before its first
    step: until then the hint repeats them (else it would resume with the old
    values: a max_num_steps already reached has "nothing to do")."""
    if list_checkpoints(run_dir):
        saved = run_dir / "config.yaml"
        unsaved = () if saved.is_file() and saved.read_text() == dump_config(cfg) else overrides
        command = shlex.join(["asyncrl", "train", "--resume", str(run_dir), *unsaved])
        return f"stopped while starting, before its first step; resume with: {command}"
    return ("stopped while starting, before its first step: nothing was trained, the "
            "same command starts it again")


class _Run:
    """One run's pieces, its event-loop program and its ending."""

    def __init__(self, cfg: RunConfig, run_dir: Path, task: Task,
                 engines: Sequence[RolloutEngine], trainer: Trainer,
                 evaluator: Evaluator | None, tokenizer: PolicyTokenizer,
                 planner: Planner | None = None) -> None:
        self.cfg, self.run_dir, self.task = cfg, run_dir, task
        self.planner = planner
        self.journal: JsonlSink | None = None
        self.engines, self.trainer, self.evaluator = engines, trainer, evaluator
        self.tokenizer = tokenizer
        self.scorer = build_scorer(task, cfg.task)
        self.controller: Controller | None = None
        self.stop: GracefulStop | None = None
        self.final_dir: Path | None = None
        #: The run raised (it exports no final/: asyncrl.run.ending says why).
        self.failed = False
        self.began = time.monotonic()  # when train() was called
        self.startup_s: float | None = None  # set when the first step is about to start
        #: The policy's vocabulary (the preflight's): engines' token ids must index it.
        self.vocab_size: int | None = None

    def build_controller(self, resume: LoadedCheckpoint | None,
                         extra_sinks: Sequence[MetricsSink]) -> None:
        """The run's controller with its sinks, ledger file and checkpoint hook,
        restored from ``resume``."""
        cfg, run_dir = self.cfg, self.run_dir
        start = resume.step if resume is not None else 0
        if resume is not None:
            # Steps after the checkpoint were logged by the run that died; they are
            # trained again now, so their old records go.
            truncate_metrics(run_dir / "metrics.jsonl", before_step=start)
            # The autopilot's decisions up to the checkpoint (made at steps_done <= start).
            truncate_metrics(run_dir / AUTOPILOT_FILE, before_step=start + 1)
        sinks: list[MetricsSink] = [JsonlSink(run_dir / "metrics.jsonl", append=bool(resume))]
        if cfg.logging.tensorboard:
            sinks.append(TensorBoardSink(run_dir / "tb", purge_step=start if resume else None))
        progress = progress_sink(cfg.logging.progress, cfg.grpo.max_num_steps, start_step=start,
                                 every_s=cfg.logging.progress_every_s)
        if progress is not None:
            sinks.append(progress)
        if cfg.logging.wandb is not None:
            from asyncrl.metrics.wandb_sink import WandbSink

            sinks.append(WandbSink(cfg.logging.wandb, run_dir, cfg.model_dump(mode="json")))
        sinks.extend(extra_sinks)
        # One line per finished prompt group, appended as groups end (a resume cuts
        # it back to the checkpoint); the groups still pending are added at the end.
        history = JsonlHistory(run_dir / "ledger.jsonl")
        if resume is None:
            history.truncate(0)
        self.controller = Controller(
            task=self.task, engines=self.engines, trainer=self.trainer, grpo=cfg.grpo,
            async_rl=cfg.async_rl, seed=cfg.seed, deterministic=cfg.deterministic, sinks=sinks,
            on_step_end=CheckpointHook(run_dir, cfg.checkpoint, dump_config(cfg)),
            ledger_history=history,
            scorer=self.scorer, evaluator=self.evaluator, planner=self.planner,
            vocab_size=self.vocab_size,
        )
        self.journal = autopilot_files(self.controller.autopilot, run_dir,
                                       append=resume is not None)
        if resume is not None:
            self.controller.load_state_dict(resume.controller_state)

    def execute(self, resume: LoadedCheckpoint | None, snapshots: Any) -> RunDirSummary:
        """Run the event-loop program; whatever happens, write the run directory."""
        forced: BaseException | None = None
        try:
            run_event_loop(self._main(resume, snapshots))
        except KeyboardInterrupt as exc:  # a signal outside the loop's handlers
            forced = exc
            raise
        except asyncio.CancelledError as exc:
            forced = exc
            if self.stop is not None and self.stop.forced:  # the second signal
                raise (Terminated if self.stop.reason is StopReason.TERMINATED
                       else KeyboardInterrupt)(
                    "stopped at once on a second signal") from None
            raise
        finally:
            summary = self.finish(forced=forced)
            if forced is not None:
                print(f"asyncrl: the run stopped at once; resume it with: "
                      f"{summary.get('resume_command')}", file=sys.stderr)
        return summary

    async def _main(self, resume: LoadedCheckpoint | None, snapshots: Any) -> None:
        controller = self.controller
        assert controller is not None
        loop = asyncio.get_running_loop()
        current = asyncio.current_task()
        assert current is not None
        self.stop = GracefulStop(controller, current)
        try:
            self.stop.install(loop)  # a signal inside it raises KeyboardInterrupt here
        except BaseException as exc:
            # An error here is a failed run too (its final note must not blame an export).
            self.failed = isinstance(exc, Exception)
            await self.close()
            raise
        failed = False
        try:
            if resume is not None:
                await self._load_resumed_weights(resume)
                for engine, caps in zip(self.engines, controller.capabilities):
                    if snapshots and caps.retained_weights:
                        engine.restore_retained(snapshots)  # type: ignore[attr-defined]
            self.startup_s = time.monotonic() - self.began
            hook = controller.on_step_end
            assert isinstance(hook, CheckpointHook)
            if hook.save_by is not None:
                hook.save_by.note_start()
            try:
                # `asyncrl fleet RUN_DIR ...` reaches the run while it trains.
                async with fleet_channel(self.run_dir, controller.fleet.handle):
                    await controller.run()
            except Exception as exc:
                await self._finish_pending_write()
                if controller.stopped_at_safe_point:  # the state is whole: keep it
                    await self._checkpoint_at_error(exc)
                else:  # maybe half-updated (the trainer raised in a step): not checkpointed
                    add_note(exc, error_resume_hint(self.run_dir))
                # The error is all the CLI prints of a failed run: say there, too,
                # why final/ is missing and what exports the weights instead.
                add_note(exc, f"final policy: {final_note(self.run_dir, failed=True)}")
                raise
            await self._end_of_run()
        except Exception:
            failed = True  # a failed run exports no final/ (asyncrl.run.ending says why)
            raise
        finally:
            try:
                # The final policy, unless the run failed or was asked to stop at once.
                if not self.stop.forced and not failed:
                    self.final_dir = await export_final(self.run_dir, self.cfg, self.trainer,
                                                        self.task, self.tokenizer)
                self.failed = failed
                # The engines close under the loop's handlers too: the loop wakes on a
                # signal whichever thread the kernel hands it to (asyncio watches a
                # wakeup fd), where a Python handler would wait for the main thread
                # to run - never, while the loop sleeps on an engine that never closes.
                await self.close()
            finally:
                self.stop.uninstall(loop)

    async def _load_resumed_weights(self, resume: LoadedCheckpoint) -> None:
        """The engines start from the checkpoint's weights, at its version. An
        engine whose ``update_weights`` raises is a bug of that engine, reported
        as a run's weight sync reports it (:mod:`asyncrl.controller.weight_sync`):
        nothing was trained, so the checkpoint stays the one to resume from."""
        weights = await self.trainer.get_weights()
        # Every engine's load ends before the outcome is read: one that raised
        # must not leave another's load running while the engines close.
        loads = await asyncio.gather(*(e.update_weights(weights, resume.step)
                                       for e in self.engines), return_exceptions=True)
        for idx, outcome in enumerate(loads):
            if isinstance(outcome, Exception) and not isinstance(outcome, AsyncRLError):
                name = resume.path.name
                bug = weight_load_failed(self.engines[idx], idx, outcome, resume.step,
                                         when=f"loading checkpoint {name} on resume",
                                         state=f"Nothing was trained and {name} is unchanged")
                add_note(bug, f"resume with: {resume_command(self.run_dir)}")
                raise bug
            if isinstance(outcome, BaseException):
                raise outcome  # asyncrl's own errors (a lost worker) and cancellation

    async def _end_of_run(self) -> None:
        """The final checkpoint, when the run stopped with its state whole:
        normally (also when max_num_steps is not a multiple of every_steps, and
        when every_steps is 0), or gracefully on a signal."""
        controller = self.controller
        assert controller is not None
        hook = controller.on_step_end
        assert isinstance(hook, CheckpointHook)
        if controller.stop_reason in CHECKPOINTED_ENDS:
            await hook.write_final(controller)
        else:
            await hook.flush()  # a periodic write in flight ends (or fails) with the run

    async def _finish_pending_write(self) -> None:
        """A periodic checkpoint still being written when an error stops the run
        (a rank killed mid-write, seen under load) was captured whole: it is
        finished before the run ends, else the resume the error suggests finds
        no checkpoint. Its own failure is logged, never raised over the error."""
        hook = self.controller.on_step_end if self.controller is not None else None
        if not isinstance(hook, CheckpointHook):
            return
        try:
            await hook.flush()
        except Exception as exc:
            log.warning("the checkpoint being written when the run stopped failed: %r", exc)

    async def _checkpoint_at_error(self, error: BaseException) -> None:
        """A fatal error stopped the pumps at a safe point: checkpoint that state,
        and say on the error how to resume once the cause is fixed."""
        controller = self.controller
        assert controller is not None
        hook = controller.on_step_end
        assert isinstance(hook, CheckpointHook)
        try:
            path = await hook.write_final(controller)
        except Exception as exc:  # the error that stopped the run is the one to report
            log.warning("could not write a checkpoint after the error: %r", exc)
            return
        add_note(error, f"the state at the stop is checkpointed ({path.name}); after fixing "
                         f"the cause, resume with: {resume_command(self.run_dir)}")

    async def close(self) -> None:
        """Close the reward pools, then the engines, then the trainer: each one,
        even when a close before it fails or is cancelled (a second signal)."""
        eval_scorer = [self.evaluator.scorer] if self.evaluator is not None else []
        async with contextlib.AsyncExitStack() as owned:  # unwinds in reverse order
            for backend in reversed((self.scorer, *eval_scorer, *self.engines, self.trainer)):
                own_backend(owned, backend)

    def finish(self, *, forced: BaseException | None) -> RunDirSummary:
        """Write summary.json, timeline.json, the ledger's pending groups and the plots
        (also after an error); after a signal, print how to resume. ``forced``: the
        interrupt that stopped the run at once (None: it was not)."""
        controller = self.controller
        assert controller is not None
        summary = RunDirSummary(**controller.summary())
        if self.journal is not None:
            self.journal.close()
        stop = self.stop
        # A graceful stop is the controller's own stop reason. Only a forced end (a
        # second signal, or a signal outside the loop's handlers, e.g. while the
        # backends shut down) is written here.
        if forced is not None:
            first = stop.reason if stop is not None else None
            summary["stop_reason"] = str(first or (
                StopReason.TERMINATED if isinstance(forced, Terminated) else StopReason.INTERRUPTED))
            summary["stop_message"] = ("stopped at once on a second signal" if first
                                       else "stopped at once by a signal outside the run's "
                                            "event loop")
        summary["final_dir"] = None if self.final_dir is None else str(self.final_dir)
        if self.final_dir is None:
            summary["final_note"] = final_note(
                self.run_dir, failed=self.failed,
                forced=forced is not None or (stop is not None and stop.forced))
        summary["startup_s"] = self.startup_s
        hook = controller.on_step_end
        if isinstance(hook, CheckpointHook) and hook.keep_best is not None:
            summary["best_checkpoint"] = hook.best()
        return finish_run_dir(self.run_dir, controller, self.task, self.cfg, summary,
                              plots=forced is None)


def _restore(cfg: RunConfig, task: Task, engines: Sequence[RolloutEngine], trainer: Trainer,
             resume: LoadedCheckpoint, run_dir: Path,
             planner: Planner | None = None) -> tuple[LoadedCheckpoint, Any]:
    """Load ``resume`` into the trainer (and a trial controller); when its content
    does not fit, fall back to older checkpoints of the same run, one warning each.

    Returns the checkpoint used and the engine snapshots it holds. A fork
    (``run_dir`` is not the checkpoint's run) gets a copy of that checkpoint.
    """
    source = resume.path.parent.parent
    problems: list[str] = []
    for ckpt in itertools.chain([resume], iter_checkpoints(source, older_than=resume.step,
                                                           resumable=True)):
        trainer_state = dict(ckpt.trainer_state)
        snapshots = trainer_state.pop(ENGINE_SNAPSHOTS, None)
        try:
            # The controller first: its prompt source checks that the data is the
            # checkpoint's (changed data would also change a from-scratch model's
            # vocabulary, and the trainer would only see a size mismatch).
            Controller(task=task, engines=engines, trainer=trainer, grpo=cfg.grpo,
                       async_rl=cfg.async_rl, seed=cfg.seed, deterministic=cfg.deterministic,
                       planner=planner).load_state_dict(ckpt.controller_state)
            trainer.load_state_dict(trainer_state)
        except ConfigError:
            raise  # the config or the data is wrong, not the checkpoint: the message says so
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
