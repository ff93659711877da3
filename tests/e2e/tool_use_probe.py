"""``task.rollout`` for the tool-use end-to-end tests: the example's calculator
(examples/tool_use.py), keeping every group's record and its session's start weight
for the test to read."""

from __future__ import annotations

from asyncrl.record import Completion
from asyncrl.rollouts import RolloutOutput, RolloutSession
from asyncrl.types import Prompt
from tool_use import calculator as example

#: (start weight, completions) of every group the run generated.
RECORDS: list[tuple[int, list[Completion]]] = []


async def calculator(prompt: Prompt, session: RolloutSession) -> RolloutOutput:
    out = await example(prompt, session)
    RECORDS.append((session.start_weight, list(out.completions)))
    return out
