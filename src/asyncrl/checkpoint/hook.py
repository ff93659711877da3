"""Checkpointing during a run: :class:`CheckpointHook` (loading them back for
``asyncrl train --resume RUN_DIR`` is :mod:`asyncrl.run.resume`'s)."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl._util.bounded import append_bounded
from asyncrl.checkpoint.store import shards_dir, write_checkpoint
from asyncrl.trainers.base import final_state_dict

if TYPE_CHECKING:
    from asyncrl.config import CheckpointConfig

log = logging.getLogger("asyncrl.checkpoint")

#: Key of the engine's retained weight versions inside trainer.pt (deterministic mode).
ENGINE_SNAPSHOTS = "engine_weight_snapshots"


@dataclass
class _Captured:
    step: int
    controller_state: dict[str, Any]
    trainer_state: dict[str, Any]


class CheckpointHook:
    """``Controller.on_step_end``: a checkpoint after the weight sync of every
    ``checkpoint.every_steps``-th step; :meth:`write_final` writes the last one when
    the run stops (normally, or gracefully on a signal). Every checkpoint holds
    ``config_yaml``, the run's resolved config, as written to ``config.yaml``."""

    def __init__(self, run_dir: str | Path, checkpoint: CheckpointConfig,
                 config_yaml: str) -> None:
        self.run_dir = Path(run_dir)
        self.every = checkpoint.every_steps
        self.keep_last = checkpoint.keep_last
        self.config_yaml = config_yaml
        #: Checkpoints written (the newest ones of a long run).
        self.written: list[Path] = []

    async def __call__(self, controller: Any, version: int) -> None:
        if self.every and version % self.every == 0:
            await controller.read_partials()  # groups generating keep their tokens
            await self._write(await self.capture(controller, version))

    async def capture(self, controller: Any, version: int, *, final: bool = False) -> _Captured:
        """Both states of the same moment, without blocking the event loop.

        The controller's state is small and taken at once, on the loop, before
        any other task runs. The trainer's (a copy of the model and optimizer:
        seconds for a large model) is taken in a worker thread while the loop
        keeps serving the rollout side: the trainer does not change meanwhile,
        because the train pump is waiting for this hook (or has stopped).
        ``final``: no trainer call follows (the run has stopped), so a trainer
        with ``final_state_dict`` hands over its tensors rather than copies.
        """
        controller_state = controller.state_dict()
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
        if snapshots is not None:
            trainer_state = {**trainer_state, ENGINE_SNAPSHOTS: snapshots}
        return _Captured(version, controller_state, trainer_state)

    async def _write(self, state: _Captured) -> Path:
        path = await asyncio.to_thread(self._write_and_free, state)
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
                keep_last=self.keep_last)
        finally:
            state.trainer_state, state.controller_state = {}, {}

    async def write_final(self, controller: Any) -> Path:
        """The checkpoint of the state the run stopped in: after ``controller.run()``
        returned, before the backends close. Groups in flight then (cancelled by
        the stop) and the groups of a step a stop interrupted are in it, as in
        every checkpoint; it replaces a periodic one of the same step."""
        return await self._write(await self.capture(controller, controller.version.value,
                                                    final=True))
