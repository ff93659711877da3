"""What a rollout function returns."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.record import Completion


@dataclass(frozen=True)
class RolloutOutput:
    """A prompt group's finished transcripts (made by its session, one per
    generation) and their rewards: one float each, or None to have the task's
    reward score each transcript's text (policy and environment tokens decoded)."""

    completions: Sequence[Completion]
    rewards: Sequence[float] | None = None


__all__ = ["RolloutOutput"]
