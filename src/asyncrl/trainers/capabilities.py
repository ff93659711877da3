"""What a trainer can do beyond :class:`~asyncrl.trainers.Trainer`.

Each optional capability is a small protocol, named in
:class:`TrainerCapabilities` by its member. The controller reads a trainer's
capabilities once, when it is handed the trainer, and calls an optional member
only where the trainer has it; ``asyncrl validate --json`` lists them, and names a
public attribute that looks like one misspelled.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

from asyncrl._util.capabilities import Capabilities

__all__ = ["FinalState", "ShardsState", "TrainerCapabilities"]


@runtime_checkable
class FinalState(Protocol):
    def final_state_dict(self) -> dict[str, Any]:
        """Called once the run has stopped (the final checkpoint, the final
        policy; no trainer call follows): ``state_dict()``'s state, free to share
        the tensors it already holds on the CPU rather than copy them. Without
        it: ``state_dict()``."""
        ...


@runtime_checkable
class ShardsState(Protocol):
    def sharded_state_dict(self, directory: str | Path) -> dict[str, Any]:
        """Called instead of ``state_dict()`` when a checkpoint is written: the
        trainer writes its shards into ``directory`` (new and empty) itself and
        returns the small rest of its state, which names ``directory``."""
        ...


@dataclasses.dataclass(frozen=True)
class TrainerCapabilities(Capabilities):
    """Which optional protocols a trainer satisfies (one flag per protocol)."""

    MEMBERS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "final_state_dict": ("final_state_dict",),
        "sharded_state_dict": ("sharded_state_dict",),
    }
    REQUIRED: ClassVar[tuple[str, ...]] = (
        "train_chunk", "finish_step", "get_weights", "state_dict", "load_state_dict", "close")
    PROTOCOL: ClassVar[str] = "asyncrl.trainers.Trainer"

    final_state_dict: bool = False
    sharded_state_dict: bool = False
