"""Checkpointing during a run: :class:`CheckpointHook`, the controller's ``on_step_end``.

After the weight sync of a step, the hook decides whether a checkpoint is due
(``every_steps``, ``every_minutes``) and whether the ``save_by`` deadline asks
the run to stop (:mod:`asyncrl.checkpoint.deadline`). A checkpoint is taken in
two parts:

* the capture, which holds the train pump: the controller's state (small, at
  once, on the loop) and a copy of the trainer's (in a worker thread; the
  trainer does not change meanwhile, the pump is waiting);
* the write (files, fsyncs, checksums, the rename into place, pruning), in the
  background while training goes on. One write at a time: the next checkpoint,
  :meth:`flush` and :meth:`write_final` wait for the one in flight, and raise
  its failure (:class:`~asyncrl.errors.CheckpointError`, naming the checkpoint),
  which fails the run: a checkpoint is never silently missing. A write that
  never finished (the process killed) leaves a temporary directory, never a
  half checkpoint, so the previous one stays the newest valid one.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import difflib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl._util.bounded import append_bounded
from asyncrl.checkpoint.deadline import SaveBy
from asyncrl.checkpoint.retention import best
from asyncrl.checkpoint.store import entries, shards_dir, write_checkpoint
from asyncrl.errors import CheckpointError
from asyncrl.trainers.base import final_state_dict
from asyncrl.types import StopReason

if TYPE_CHECKING:
    from asyncrl.config import CheckpointConfig

log = logging.getLogger("asyncrl.checkpoint")

#: Key of the engine's retained weight versions inside trainer.pt (deterministic mode).
ENGINE_SNAPSHOTS = "engine_weight_snapshots"
#: Added to the nice value of the thread that writes checkpoints.
WRITER_NICE = 10


def _lower_priority() -> None:
    """The writer thread's initializer: on Linux a thread's nice value is its own,
    so a background write yields the CPU to training rather than taking an equal
    share of it (on a CPU-bound 2-core run the steps beside a write slowed by
    about what the write no longer held the pump: benchmarks/bench_checkpoint_stall.py).
    Elsewhere the write shares the CPU as it is."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)
    except (AttributeError, OSError):  # pragma: no cover - no per-thread priority here
        pass


@dataclass
class _Captured:
    step: int
    controller_state: dict[str, Any]
    trainer_state: dict[str, Any]
    metric: float | None = None
    resumable: bool = True
    #: Clock time the capture began (the write measures capture + write from it).
    began: float = 0.0


class CheckpointHook:
    """``Controller.on_step_end``: a checkpoint after the weight sync of every
    ``every_steps``-th step and every ``every_minutes``; :meth:`write_final`
    writes the last one when the run stops (normally, gracefully on a signal or
    for the ``save_by`` deadline). Every checkpoint holds ``config_yaml``, the
    run's resolved config, as written to ``config.yaml``. ``clock``: the run's
    clock (injected by tests); ``started_at``: the clock time ``save_by`` counts
    from (None: the process start)."""

    def __init__(self, run_dir: str | Path, checkpoint: CheckpointConfig, config_yaml: str,
                 *, clock: Callable[[], float] = time.monotonic,
                 started_at: float | None = None) -> None:
        c = checkpoint
        self.run_dir = Path(run_dir)
        self.every = c.every_steps
        self.every_s = c.every_minutes * 60.0
        self.keep_last, self.keep_best = c.keep_last, c.keep_best
        self._told_unlogged = False  # the train/ metric warning is given once
        self.snapshots = not c.save_optimizer
        self.config_yaml = config_yaml
        self.clock = clock
        self.save_by = (SaveBy(c.save_by_s, clock=clock, started_at=started_at)
                        if c.save_by_s is not None else None)
        self._last_began = clock()
        self._pending: asyncio.Task[Path] | None = None
        #: The one thread that writes checkpoints, at a lower priority.
        self._writer = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix="asyncrl-checkpoint-write", initializer=_lower_priority)
        #: Checkpoints written (the newest ones of a long run).
        self.written: list[Path] = []

    @property
    def writing(self) -> bool:
        """True while a checkpoint's write is in flight."""
        return self._pending is not None and not self._pending.done()

    async def __call__(self, controller: Any, version: int) -> None:
        if self._pending is not None and self._pending.done():
            await self.flush()  # a write that failed stops the run now, naming it
        if self.save_by is not None:
            self.save_by.step_done()
            if self.save_by.must_stop():
                # The final checkpoint (write_final) is the one this stop writes.
                controller.request_stop(StopReason.SAVE_BY, self.save_by.message(version))
                return
        if self._due(version):
            await self.flush()  # one write at a time (the rollout side runs meanwhile)
            await controller.read_partials()  # groups generating keep their tokens
            state = await self.capture(controller, version, snapshot=self.snapshots)
            self._pending = asyncio.create_task(self._write(state))
            log.debug("checkpoint step-%06d captured; writing it while training goes on",
                      version)

    def _due(self, version: int) -> bool:
        by_steps = bool(self.every) and version % self.every == 0
        by_time = bool(self.every_s) and self.clock() - self._last_began >= self.every_s
        return by_steps or by_time

    async def flush(self) -> None:
        """Wait for the write in flight; raise its failure."""
        pending, self._pending = self._pending, None
        if pending is not None:
            await pending

    async def capture(self, controller: Any, version: int, *, final: bool = False,
                      snapshot: bool = False) -> _Captured:
        """Both states of the same moment, without blocking the event loop.

        The controller's state is small and taken at once, on the loop, before
        any other task runs. The trainer's (a copy of the model and optimizer:
        seconds for a large model) is taken in a worker thread while the loop
        keeps serving the rollout side: the trainer does not change meanwhile,
        because the train pump is waiting for this hook (or has stopped).
        ``final``: no trainer call follows (the run has stopped), so a trainer
        with ``final_state_dict`` hands over its tensors rather than copies.
        ``snapshot``: the weights alone (the optimizer state is left out).
        """
        began = self._last_began = self.clock()
        controller_state = controller.state_dict()
        metric = self._metric(controller, version)
        # Deterministic mode: in-flight groups are pinned to recent weight versions
        # the trainer no longer holds; the engine's copies make the replay exact.
        # (They change only in a weight sync, which waits for this hook too.)
        pins = controller.deterministic and controller.capabilities[0].retained_weights
        snapshots = controller.engines[0].retained_weights() if pins else None  # type: ignore[attr-defined]
        # A sharded trainer's ranks write their shards themselves (moved into the
        # checkpoint with the rest); any other trainer hands over its whole state.
        trainer, caps = controller.trainer, controller.trainer_capabilities
        if caps.sharded_state_dict:
            trainer_state = await asyncio.to_thread(trainer.sharded_state_dict,
                                                    shards_dir(self.run_dir, version))
        else:
            take = (functools.partial(final_state_dict, trainer, caps) if final
                    else trainer.state_dict)
            trainer_state = await asyncio.to_thread(take)
        if snapshot:  # weights for evaluation and export: no optimizer, no resume
            trainer_state = {k: v for k, v in trainer_state.items() if k != "optimizer"}
        if snapshots is not None:
            trainer_state = {**trainer_state, ENGINE_SNAPSHOTS: snapshots}
        return _Captured(version, controller_state, trainer_state, metric,
                         resumable=not snapshot, began=began)

    def _metric(self, controller: Any, version: int) -> float | None:
        """The ``keep_best`` metric of the step that made ``version`` (None when that
        step did not log it, e.g. a step without evaluation)."""
        if self.keep_best is None:
            return None
        records = controller.step_records
        if not records or records[-1].get("trainer_version") != version:
            return None
        value = records[-1].get(self.keep_best.metric)
        if value is None and self.keep_best.metric.startswith("train/"):
            self._tell_unlogged(records[-1])
        return float(value) if isinstance(value, (int, float)) else None

    def _tell_unlogged(self, record: dict[str, Any]) -> None:
        """A ``train/`` metric is the trainer's to name, so the checks before the
        run cannot refuse a misspelled one; the trainer reports its metrics at
        every step, so the first step record without it says so (once)."""
        if self._told_unlogged:
            return
        self._told_unlogged = True
        metric = self.keep_best.metric  # type: ignore[union-attr]
        names = sorted(k for k in record if k.startswith("train/"))
        close = difflib.get_close_matches(metric, names, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        log.warning("checkpoint.keep_best.metric=%r is not among the trainer's metrics (%s): "
                    "no checkpoint is kept as the best by it; %sfix the name and resume",
                    metric, ", ".join(names) or "none", hint)

    async def _write(self, state: _Captured) -> Path:
        try:
            path = await asyncio.get_running_loop().run_in_executor(
                self._writer, self._write_and_free, state)
        except Exception as exc:
            raise CheckpointError(
                f"writing checkpoint step-{state.step:06d} to {self.run_dir / 'checkpoints'} "
                f"failed ({type(exc).__name__}: {exc}); the newest complete checkpoint is "
                "kept. Free space or fix the directory's permissions, then resume with: "
                f"asyncrl train --resume {self.run_dir}") from exc
        if self.save_by is not None:
            self.save_by.checkpoint_took(self.clock() - state.began)
        append_bounded(self.written, path)
        log.info("checkpoint written: %s", path)
        return path

    def _write_and_free(self, state: _Captured) -> Path:
        """In a worker thread: write the checkpoint, then let go of the states here
        too (the captured copies are freed now, in this thread: freeing a gigabyte
        of tensors takes tens of ms, which would otherwise stall the event loop
        when the coroutine that holds them ends)."""
        try:
            return write_checkpoint(
                self.run_dir, state.step, controller_state=state.controller_state,
                trainer_state=state.trainer_state, config_yaml=self.config_yaml,
                keep_last=self.keep_last, keep_best=self.keep_best, metric=state.metric,
                resumable=state.resumable)
        finally:
            state.trainer_state, state.controller_state = {}, {}

    async def write_final(self, controller: Any) -> Path:
        """The checkpoint of the state the run stopped in: after ``controller.run()``
        returned, before the backends close. Groups in flight then (cancelled by
        the stop) and the groups of a step a stop interrupted are in it, as in
        every checkpoint; it replaces a periodic one of the same step. Always
        whole (a resume needs it), and written before this returns."""
        await self.flush()
        return await self._write(await self.capture(controller, controller.version.value,
                                                    final=True))

    def best(self) -> dict[str, Any] | None:
        """The best checkpoint kept by ``keep_best`` (None: no keep_best, or no
        checkpoint logged its metric)."""
        if self.keep_best is None:
            return None
        top = best(entries(self.run_dir), self.keep_best)
        if not top:
            return None
        return {"path": str(top[0].path), "step": top[0].step,
                "metric": self.keep_best.metric, "value": top[0].metric}


__all__ = ["ENGINE_SNAPSHOTS", "CheckpointHook"]
