"""The simulated task: endless placeholder prompts (see :mod:`asyncrl.sim.backends`)."""

from __future__ import annotations

from typing import Any

from asyncrl.types import Prompt


class SimSource:
    """An endless stream of placeholder prompts, numbered 0, 1, 2, ..."""

    def __init__(self) -> None:
        self.position = 0

    def next_prompt(self) -> Prompt | None:
        index = self.position
        self.position = index + 1
        return Prompt(index, "")

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])


class SimTask:
    """Endless prompts; rewards come with each simulated group, so :meth:`reward`
    is never asked (it exists for the protocol and returns 0)."""

    name = "sim"
    target_reward = 1.0

    def prompt_source(self, seed: int) -> SimSource:
        return SimSource()

    def reward(self, prompt: Prompt, completion: str) -> float:
        return 0.0
