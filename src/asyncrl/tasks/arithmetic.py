"""Arithmetic: ``"3+5="`` -> ``"8"``.

The smallest task that needs the policy to learn something: a table of sums
(or differences, products) it must look up from the two operands.
"""

from __future__ import annotations

import operator
import random

from asyncrl.config import ArithmeticTaskConfig
from asyncrl.errors import ConfigError
from asyncrl.tasks.common import SeededPromptSource, match_reward
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.types import Prompt

OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class ArithmeticTask:
    """``a <op> b =`` with operands in ``[0, max_operand]``; the answer is the result
    in decimal (with a leading ``-`` when negative). Reward: :func:`match_reward`."""

    name = "arithmetic"
    #: Counts as learned at a mean reward of 0.9: about nine exact answers in ten.
    target_reward = 0.9

    def __init__(self, cfg: ArithmeticTaskConfig | None = None) -> None:
        cfg = cfg or ArithmeticTaskConfig()
        bad = set(cfg.operators) - set(OPERATORS)
        if not cfg.operators or bad:
            raise ConfigError(
                f"task.operators={cfg.operators!r}: use one or more of {''.join(OPERATORS)!r}"
            )
        self.cfg = cfg
        self.operators = "".join(dict.fromkeys(cfg.operators))  # distinct, in the given order
        # Only the characters prompts and answers use: digits, the operators, '=', and
        # '-' for negative differences.
        self.tokenizer = CharTokenizer.for_text(
            "0123456789=-" if "-" in self.operators else "0123456789=", self.operators
        )

    @property
    def longest_prompt_text(self) -> str:
        """A prompt as long as any this task makes (both operands at their longest):
        what the context-length check measures (:mod:`asyncrl.policy.context_length`)."""
        top = str(self.cfg.max_operand)
        return f"{top}{self.operators[0]}{top}="

    def make_prompt(self, rng: random.Random, position: int) -> tuple[str, str]:
        a = rng.randint(0, self.cfg.max_operand)
        b = rng.randint(0, self.cfg.max_operand)
        op = rng.choice(self.operators)
        return f"{a}{op}{b}=", str(OPERATORS[op](a, b))

    def prompt_source(self, seed: int) -> SeededPromptSource:
        return SeededPromptSource(
            self.make_prompt, seed=seed, task=self.name, limit=self.cfg.num_prompts
        )

    def reward(self, prompt: Prompt, completion: str) -> float:
        return match_reward(completion, prompt.answer, self.cfg.partial_credit)
