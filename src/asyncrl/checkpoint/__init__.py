"""Checkpoints with nothing lost: written during a run (:class:`CheckpointHook`),
listed, verified and loaded (resuming a run is :mod:`asyncrl.run.resume`'s)."""

from asyncrl.checkpoint.deadline import EXIT_CODE as SAVE_BY_EXIT_CODE
from asyncrl.checkpoint.hook import CheckpointHook
from asyncrl.checkpoint.store import (
    LoadedCheckpoint,
    iter_checkpoints,
    list_checkpoints,
    load_latest,
    verify,
    write_checkpoint,
)

__all__ = [
    "SAVE_BY_EXIT_CODE",
    "CheckpointHook",
    "LoadedCheckpoint",
    "iter_checkpoints",
    "list_checkpoints",
    "load_latest",
    "verify",
    "write_checkpoint",
]
