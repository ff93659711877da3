"""What a task must provide: prompts in a reproducible order, and rewards."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from asyncrl.types import Prompt


@runtime_checkable
class PromptSource(Protocol):
    """A seeded, resumable stream of prompts."""

    def next_prompt(self) -> Prompt | None:
        """Called by the rollout pump whenever it needs a prompt (a new dispatch
        batch, or a replacement for a group that failed for good). None when the
        source is exhausted."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Called when a checkpoint is written: the position in the stream."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called on resume, before the first ``next_prompt``."""
        ...


@runtime_checkable
class Task(Protocol):
    """A verifiable task: where prompts come from and how completions score.

    These four members are all a task needs (the pre-run checks refuse a task
    that lacks one). A task may offer more, each an optional protocol of
    :mod:`asyncrl.tasks.capabilities`, used only where the task has it:

    * ``tokenizer`` - read when a from-scratch policy is built: its vocabulary;
    * ``bind_tokenizer(tokenizer)`` - called once before the first prompt, with
      the policy's tokenizer, unless ``needs_policy_tokenizer`` is False;
    * ``pooled_reward`` - read once when the reward pool is built: the picklable
      function its workers call instead of ``reward``;
    * ``prepare_reward(prompt)`` - called on the event loop before each group is
      scored: the prompt as the reward sees it;
    * ``longest_prompt_text`` - read by the context-length check;
    * ``cfg`` - the task's config block (its reward pool settings);
    * the records of a file (``num_records``, ``raw_prompt``, ... : the dataset
      task) - scanned by the context-length check, held out by evaluation.

    ``asyncrl validate --json`` lists which of them a task has, and warns about a
    public attribute that looks like one of them misspelled.
    """

    name: str
    #: Mean reward at which the task counts as learned (reported in summaries).
    target_reward: float

    def prompt_source(self, seed: int) -> PromptSource:
        """Called once at the start of a run: prompts in a reproducible order."""
        ...

    def reward(self, prompt: Prompt, completion: str) -> float:
        """Called by the rollout pump once per completion when a group finishes;
        returns a reward in [0, 1]."""
        ...


@runtime_checkable
class Scorer(Protocol):
    """Scores finished prompt groups off the event loop.

    The controller awaits :meth:`score` once per generation attempt that
    returned completions without rewards; a slow reward then delays only that
    group, never admission or the train pump. The built-in
    :class:`asyncrl.tasks.rewards.RewardPool` runs ``Task.reward`` in a worker
    pool with a per-call timeout.
    """

    async def score(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        """Called by the rollout side when a group's generation finishes: one reward
        per completion. Raises :class:`~asyncrl.errors.RewardError` when a reward
        raises or times out; the controller then retries the attempt (and in the
        end records the group ``failed``), the run goes on."""
        ...

    async def close(self) -> None:
        """Called once when the run ends: stop the workers."""
        ...
