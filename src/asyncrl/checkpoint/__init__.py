"""Checkpoints with nothing lost, and resume."""

from asyncrl.checkpoint.resume import (
    IMMUTABLE,
    CheckpointHook,
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
