"""A prompt on its way to the buffer, and the explicit state it is in.

Transitions (docs/controller.md draws them)::

    QUEUED ──► AWAIT_INFLIGHT ──► AWAIT_BUFFER ──► (reserved) GENERATING
                    ▲  │               │                 │  ▲     │
                    └──┴───────────────┘                 ▼  │     ▼
                                                     BACKOFF     SCORING ──► COMMIT_WAIT
                                                                    │            │
                                                                    ▼            ▼
                                                    committed (ready) / failed / aborted

``QUEUED`` and the two ``AWAIT_*`` states come before a buffer slot is
reserved; the others hold one. A group in a *working* state will reach the
buffer (or fail) without anything the train pump does, which is what the
train pump's starvation check needs to know.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from typing import Any

from asyncrl.types import GroupId, GroupResult, Prompt, prompt_from_dict, prompt_to_dict


class EntryState(enum.Enum):
    """Each state knows whether a group in it is *working* (will reach the
    buffer, or fail, without the train pump doing anything) and whether it
    holds one of the ``async_rl.max_inflight_prompts`` permits."""

    #: admitted (or a replacement / resumed group), waiting its turn
    QUEUED = ("queued", False, False)
    #: next in line; async_rl.max_inflight_prompts reached
    AWAIT_INFLIGHT = ("await_inflight", False, False)
    #: next in line; the buffer is full
    AWAIT_BUFFER = ("await_buffer", False, False)
    #: an engine attempt is running
    GENERATING = ("generating", True, True)
    #: waiting to retry a failed attempt
    BACKOFF = ("backoff", True, True)
    #: the rewards of a finished attempt are being computed
    SCORING = ("scoring", True, True)
    #: deterministic mode: finished, an earlier group has not
    COMMIT_WAIT = ("commit_wait", True, False)
    #: committed, failed or aborted: no longer the dispatcher's
    LEFT = ("left", False, False)

    def __init__(self, label: str, working: bool, inflight: bool) -> None:
        self.label = label
        self.working = working
        self.inflight = inflight


@dataclasses.dataclass(eq=False, slots=True)
class Entry:
    prompt: Prompt
    #: The sampler's target_step stamp of the batch (None: the policy stamps none).
    stamp: int | None
    #: Deterministic mode: the weight version the group is generated with.
    pin: int | None = None
    #: True for the prompts of an admitted dispatch batch (not replacements or resumed groups).
    batch: bool = False
    #: Set when a slot is reserved; a resumed in-flight group keeps its id.
    group_id: GroupId | None = None
    attempts: int = 0
    #: Attempts lost with a dead engine worker: not charged to any budget.
    lost: int = 0
    #: Attempts charged to the prompt's infra and data budgets (independent counters).
    infra_failures: int = 0
    data_failures: int = 0
    #: Dispatch index of the batch the prompt was admitted with (a replacement
    #: keeps its predecessor's): the step a drop shrinks when there is no stamp.
    batch_index: int | None = None
    #: Fresh prompts that took the place of this slot's dropped groups so far.
    replacements: int = 0
    start_weight: int = 0
    #: The end weight of the result the last attempt returned (set as it is checked).
    end_weight: int = 0
    state: EntryState = EntryState.QUEUED
    engine: int | None = None
    #: The engine whose infra failure the next attempt should steer clear of.
    avoid: int | None = None
    aborted: bool = False
    task: asyncio.Task[None] | None = None
    #: Tokens the group had when a run stopped (restored from a checkpoint):
    #: every attempt continues from them. None: from the prompt.
    prefix: GroupResult | None = None
    #: The freshest tokens of the current attempt the controller knows of (read
    #: for a checkpoint, handed back by an engine at a stop, or the finished
    #: result while it is scored): what a checkpoint keeps. None: none yet.
    partial: GroupResult | None = None
    #: A filtered group's replacement past ``grpo.dynamic_sampling.max_gen_batches``:
    #: queued but not generated until the budget in force allows it (a resumed
    #: run's, :meth:`~asyncrl.controller.dynamic_sampling.DynamicSampling.settle`).
    owed: bool = False
    #: Set at a graceful stop, or when the run is ending and cancelled the
    #: group's task: the engine hands its tokens back and the group stays pending.
    stopping: bool = False

    def kept_tokens(self) -> GroupResult | None:
        """What a checkpoint keeps of this group's generation."""
        return self.partial if self.partial is not None else self.prefix

    @property
    def continues(self) -> bool:
        """True for a resumed group that continues tokens it already had."""
        return self.prefix is not None and self.prefix.num_tokens > 0


def entry_to_dict(entry: Entry) -> dict[str, Any]:
    kept = entry.kept_tokens()
    return {"prompt": prompt_to_dict(entry.prompt), "target_step": entry.stamp, "pin": entry.pin,
            "batch": entry.batch, "group_id": entry.group_id, "attempts": entry.attempts,
            "start_weight": entry.start_weight, "batch_index": entry.batch_index,
            "infra_failures": entry.infra_failures, "data_failures": entry.data_failures,
            "replacements": entry.replacements, "owed": entry.owed,
            "partial": None if kept is None else kept.to_dict()}


def entry_from_dict(data: dict[str, Any]) -> Entry:
    # A resumed in-flight group keeps its id, attempts, budgets and tokens but is no
    # longer part of an admitted batch: its batch already left the queue.
    inflight = data["group_id"] is not None
    partial = data.get("partial")
    return Entry(prompt_from_dict(data["prompt"]), data["target_step"], data["pin"],
                 batch=bool(data["batch"]) and not inflight, group_id=data["group_id"],
                 attempts=int(data["attempts"]), batch_index=data.get("batch_index"),
                 infra_failures=int(data.get("infra_failures", 0)),
                 data_failures=int(data.get("data_failures", 0)),
                 replacements=int(data.get("replacements", 0)),
                 owed=bool(data.get("owed", False)),
                 prefix=None if partial is None else GroupResult.from_dict(partial))
