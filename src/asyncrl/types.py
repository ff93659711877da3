"""Plain data passed between the pumps and the backends."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

GroupId = Hashable


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt from a task's prompt source.

    ``prompt_id`` is the prompt's position in the source order, unique per run;
    ``answer`` is whatever the task needs to score a completion.
    """

    prompt_id: int
    text: str
    answer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the rollout pump asks an engine to generate: one prompt group."""

    group_id: GroupId
    prompt: Prompt
    num_generations: int
    attempt: int = 1
    #: Sampling seed for this group (set in deterministic mode, else None).
    seed: int | None = None


@dataclass(slots=True)
class GroupResult:
    """What an engine returns for one prompt group.

    ``behavior_logprobs[i][t]`` is the log-probability of token
    ``completion_ids[i][t]`` under the distribution it was actually sampled
    from (after temperature / top-p), with the weights the engine held then.
    """

    group_id: GroupId
    prompt_ids: list[int]
    completion_ids: list[list[int]]
    behavior_logprobs: list[list[float]]
    completion_texts: list[str]
    start_weight: int
    end_weight: int
    #: Optional rewards computed by the engine (simulated engines); when None
    #: the controller scores ``completion_texts`` with the task.
    rewards: list[float] | None = None


@dataclass(slots=True)
class Rollout:
    """A finished prompt group as the trainer sees it (the buffer payload)."""

    group_id: GroupId
    prompt: Prompt
    result: GroupResult
    rewards: list[float]
    target_step: int | None = None
    attempts: int = 1

    @property
    def start_weight(self) -> int:
        return self.result.start_weight

    @property
    def end_weight(self) -> int:
        return self.result.end_weight


class GroupAborted(Exception):
    """Raised by an engine's ``generate`` for a group the controller aborted."""


class GenerationError(Exception):
    """A generation attempt failed; the controller retries it with backoff."""
