"""Checkpoints with nothing lost, and resume."""

from asyncrl.checkpoint.deadline import EXIT_CODE as SAVE_BY_EXIT_CODE
from asyncrl.checkpoint.hook import SAVE_BY, CheckpointHook
from asyncrl.checkpoint.resume import (
    IMMUTABLE,
    config_changes,
    config_differences,
    prepare_resume,
)
from asyncrl.checkpoint.store import (
    LoadedCheckpoint,
    iter_checkpoints,
    list_checkpoints,
    load_latest,
    verify,
    write_checkpoint,
)

__all__ = [
    "IMMUTABLE",
    "SAVE_BY",
    "SAVE_BY_EXIT_CODE",
    "CheckpointHook",
    "LoadedCheckpoint",
    "config_changes",
    "config_differences",
    "iter_checkpoints",
    "list_checkpoints",
    "load_latest",
    "prepare_resume",
    "verify",
    "write_checkpoint",
]
