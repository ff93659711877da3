"""Pieces the built-in tasks share: a resumable seeded prompt stream and the reward."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from asyncrl.types import Prompt

#: A task's recipe for one prompt: (rng, position) -> (prompt text, expected answer).
MakePrompt = Callable[[random.Random, int], tuple[str, str]]


class SeededPromptSource:
    """Prompt number ``i`` is a pure function of ``(seed, i)``.

    Each prompt draws from its own ``random.Random`` seeded with the pair, so the
    stream has no hidden state besides the position: restoring ``position``
    continues the exact sequence a fresh run would have produced.
    """

    def __init__(self, make: MakePrompt, *, seed: int, task: str, limit: int | None = None) -> None:
        self._make = make
        self._task = task
        self._limit = limit
        self.seed = seed
        self.position = 0

    def next_prompt(self) -> Prompt | None:
        if self._limit is not None and self.position >= self._limit:
            return None
        i = self.position
        # A string seed is hashed with SHA-512 by `random`, so it is stable across
        # processes (unlike hash()) and distinct seeds/positions do not collide.
        text, answer = self._make(random.Random(f"{self._task}:{self.seed}:{i}"), i)
        self.position += 1
        return Prompt(prompt_id=i, text=text, answer=answer, meta={"task": self._task})

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # The checkpoint is authoritative: it also restores the seed it was made with.
        self.seed = int(state["seed"])
        self.position = int(state["position"])


def match_reward(
    completion: str, target: str, partial_credit: float = 0.5, *, strip: bool = True
) -> float:
    """1.0 for an exact match (surrounding whitespace of the completion ignored
    unless ``strip`` is False), else partial credit.

    Partial credit = ``partial_credit * matches / max(len(completion), len(target))``
    where ``matches`` counts positions ``i`` with ``completion[i] == target[i]``.
    Dividing by the longer length makes extra characters cost as much as missing
    ones, so the policy also learns to stop. With ``partial_credit < 1`` only the
    exact answer earns 1; with 0 the reward is exact-match only.

    >>> match_reward("12", "12"), match_reward("13", "12"), match_reward("1", "12")
    (1.0, 0.25, 0.25)
    >>> match_reward("13", "12", partial_credit=0.0)
    0.0
    """
    if strip:
        completion = completion.strip()
    if completion == target:
        return 1.0
    longest = max(len(completion), len(target))
    if longest == 0 or partial_credit == 0:
        return 0.0
    matches = sum(a == b for a, b in zip(completion, target))
    return partial_credit * matches / longest
