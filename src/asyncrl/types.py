"""Plain data passed between the pumps and the backends."""

from __future__ import annotations

import enum
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

# Re-exported: engines raise these (defined with every other error in errors.py).
from asyncrl.errors import GenerationError as GenerationError
from asyncrl.errors import GroupAborted as GroupAborted

# The per-token record (asyncrl.record), re-exported with the other plain data.
from asyncrl.record import Completion as Completion
from asyncrl.record import FinishReason as FinishReason
from asyncrl.record import GroupResult as GroupResult

GroupId = Hashable


class StopReason(str, enum.Enum):
    """Why a run stopped (``controller.stop_reason``, ``summary["stop_reason"]``).

    A str: it compares equal to its value and is written as it. A caller's own
    reason (``controller.request_stop("time budget")``) stays the string it gave.
    """

    NOT_STARTED = "not started"
    RUNNING = "running"
    #: The run reached ``grpo.max_num_steps``.
    MAX_NUM_STEPS = "max_num_steps"
    #: The prompt source ran dry between steps.
    SOURCE_EXHAUSTED = "source_exhausted"
    #: The prompt source ran dry in a step: its optimizer step used fewer groups.
    INCOMPLETE_STEP = "incomplete_step"
    #: The watchdog saw no progress (``stall_action: stop``).
    STALLED = "stalled"
    #: SIGINT (Ctrl-C) or SIGTERM: stopped at the next safe point.
    INTERRUPTED = "interrupted"
    TERMINATED = "terminated"
    #: The ``checkpoint.save_by`` deadline: stopped with a checkpoint while the
    #: job had time to write it (``asyncrl train`` exits 75, a job script requeues).
    SAVE_BY = "save_by"
    #: ``controller.request_stop()`` without a reason of the caller's own.
    STOPPED = "stopped"
    ERROR = "error"
    CANCELLED = "cancelled"

    def __str__(self) -> str:
        return self.value  # f-strings and str() give the value on every Python version


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt from a task's prompt source.

    ``prompt_id`` is the prompt's position in the source order, unique per run;
    ``answer`` is whatever the task needs to score a completion. ``meta`` is the
    task's own; its ``source`` (optional: a dataset task's prompts have it) says
    where a user finds the prompt, e.g. ``data/train.jsonl line 8``, and errors
    about the prompt name it (:func:`prompt_label`).
    """

    prompt_id: int
    text: str
    answer: Any = None
    meta: dict[str, Any] = field(default_factory=dict)


def prompt_label(prompt: Prompt) -> str:
    """``prompt 3``, or ``prompt 3 (data/train.jsonl line 8)`` when the prompt
    says where it came from: how errors name a prompt. The position alone means
    nothing to a user of a shuffled dataset; the record's place in the file does."""
    source = prompt.meta.get("source")
    return f"prompt {prompt.prompt_id}" if source is None else \
        f"prompt {prompt.prompt_id} ({source})"


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """What the rollout pump asks an engine to generate: one prompt group."""

    group_id: GroupId
    prompt: Prompt
    num_generations: int
    attempt: int = 1
    #: Sampling seed for this group (set in deterministic mode, else None).
    seed: int | None = None
    #: Deterministic mode: generate with exactly this weight version (an engine
    #: keeps the few recent versions that can be named). None: current weights.
    weight_version: int | None = None
    #: Sampling overrides for this request (evaluation uses them); None: the
    #: engine's configured value. ``temperature == 0`` means greedy decoding.
    temperature: float | None = None
    top_p: float | None = None
    max_new_tokens: int | None = None
    #: The group's start weight, decided once by the controller when it reserved
    #: the group's slot; the engine echoes it in ``GroupResult.start_weight``.
    #: None (direct callers, evaluation): the version the engine holds now.
    start_weight: int | None = None
    #: Tokens the group already has (a group stopped mid-generation and resumed):
    #: completion ``i`` continues from ``prefix.completions[i]`` - from its
    #: tokens, with ``max_new_tokens`` counting them - and a finished one is
    #: returned as it is. None: generate from the prompt.
    prefix: GroupResult | None = None


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


# ---------------------------------------------------------------- persistence
# Checkpoints store plain JSON-able dicts (never pickles), so a checkpoint can
# be inspected by hand and loading one cannot execute code.
def prompt_to_dict(prompt: Prompt) -> dict[str, Any]:
    return {"prompt_id": prompt.prompt_id, "text": prompt.text, "answer": prompt.answer,
            "meta": dict(prompt.meta)}


def prompt_from_dict(data: dict[str, Any]) -> Prompt:
    return Prompt(int(data["prompt_id"]), str(data["text"]), data.get("answer"),
                  dict(data.get("meta") or {}))


def rollout_to_dict(rollout: Rollout) -> dict[str, Any]:
    return {
        "group_id": rollout.group_id,
        "prompt": prompt_to_dict(rollout.prompt),
        "rewards": list(rollout.rewards),
        "target_step": rollout.target_step,
        "attempts": rollout.attempts,
        "result": rollout.result.to_dict(),
    }


def rollout_from_dict(data: dict[str, Any]) -> Rollout:
    return Rollout(data["group_id"], prompt_from_dict(data["prompt"]),
                   GroupResult.from_dict(data["result"]), [float(x) for x in data["rewards"]],
                   data.get("target_step"), int(data.get("attempts", 1)))
