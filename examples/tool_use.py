"""A toy tool-use environment: the policy calls a calculator, then answers.

The prompt is a sum, ``"3+4="``. The policy may write a call, ``calc(3+4)``;
its turn ends at the ``)`` and the environment appends the result, ``=7``
(environment tokens: ``loss_mask`` 0, never trained). The policy then goes on
and writes its answer, ``7``, and EOS. A call the calculator cannot read gets
``=?``. Reward: 1 for the right answer after the last tool output; otherwise
half the fraction of the ideal call ``calc(3+4)`` its call starts with, so that a
policy that starts from random weights learns the call first, then to read the
result.

Used as ``task.rollout: "tool_use:calculator"`` (examples/tool_use.yaml) with
``examples/`` on ``PYTHONPATH``::

    PYTHONPATH=examples asyncrl train --config examples/tool_use.yaml
"""

from __future__ import annotations

import re

from asyncrl.rollouts import RolloutOutput, RolloutSession
from asyncrl.types import Prompt

#: Tool calls a transcript may make before the policy must answer.
MAX_CALLS = 2
CALL = re.compile(r"calc\(([0-9+]*)\)$")


def calc(expression: str) -> str:
    """The tool: the sum of ``"3+4"`` as text, ``"?"`` for anything else."""
    terms = expression.split("+")
    if not all(t.isdigit() for t in terms):
        return "?"
    return str(sum(int(t) for t in terms))


async def calculator(prompt: Prompt, session: RolloutSession) -> RolloutOutput:
    """One prompt group: every transcript may call the tool up to MAX_CALLS times."""
    transcripts = session.start()
    answer_from = [0] * len(transcripts)  # where each transcript's answer starts
    for _ in range(MAX_CALLS):
        # The policy writes until EOS, the length limit, or the ")" closing a call.
        transcripts = await session.generate(transcripts, stop=")")
        for i, t in enumerate(transcripts):
            if t.finished:
                continue
            call = CALL.search(t.text)
            transcripts[i] = session.append(t, "=" + (calc(call[1]) if call else "?"))
            answer_from[i] = len(transcripts[i])
    transcripts = await session.generate(transcripts)  # the answer: until EOS or the limit
    transcripts = [session.finish(t) for t in transcripts]
    rewards = [reward(prompt, session.decode(t.token_ids[start:]), first_call(t.text))
               for t, start in zip(transcripts, answer_from)]
    return RolloutOutput(transcripts, rewards)


def first_call(text: str) -> str:
    """What the policy wrote up to its first ``)``: its tool call, if it made one."""
    head, sep, _ = text.partition(")")
    return head + sep


def reward(prompt: Prompt, answer: str, call: str) -> float:
    if answer.strip() == prompt.answer:
        return 1.0
    ideal = f"calc({prompt.text.rstrip('=')})"
    right = next((i for i, (a, b) in enumerate(zip(call, ideal)) if a != b), min(len(call), len(ideal)))
    return 0.5 * right / len(ideal)

