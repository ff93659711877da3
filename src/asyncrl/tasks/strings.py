"""String tasks: reverse (``"rev abc="`` -> ``"cba"``) and sort (``"sort cab="`` -> ``"abc"``).

Answers are as long as the input, so they test the policy on multi-token
outputs where partial credit (characters in the right place) matters.
"""

from __future__ import annotations

import math
import random

from asyncrl.config import ReverseTaskConfig, SortTaskConfig
from asyncrl.errors import ConfigError
from asyncrl.tasks.common import SeededPromptSource, match_reward
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.types import Prompt

LETTERS_AND_DIGITS = "abcdefghijklmnopqrstuvwxyz0123456789"


class _StringTask:
    """A random string of ``min_length..max_length`` characters from ``alphabet``
    after a short instruction word; the answer is ``transform(string)``."""

    name: str
    word: str  # the instruction word at the start of every prompt
    #: Counts as learned at a mean reward of 0.9: about nine exact answers in ten.
    target_reward = 0.9

    def __init__(self, cfg: ReverseTaskConfig | SortTaskConfig) -> None:
        if cfg.min_length > cfg.max_length:
            raise ConfigError(
                f"task.min_length={cfg.min_length} is above task.max_length={cfg.max_length}; "
                "make min_length <= max_length"
            )
        if (
            not cfg.alphabet
            or len(set(cfg.alphabet)) != len(cfg.alphabet)
            or set(cfg.alphabet) - set(LETTERS_AND_DIGITS)
        ):
            raise ConfigError(
                f"task.alphabet={cfg.alphabet!r}: use distinct lowercase letters and digits"
            )
        if cfg.lengths == "long_tail" and not cfg.min_length <= cfg.median_length <= cfg.max_length:
            raise ConfigError(
                f"task.median_length={cfg.median_length} is outside [min_length, max_length] = "
                f"[{cfg.min_length}, {cfg.max_length}]; a long tail wants max_length about 10x "
                "the median"
            )
        self.cfg = cfg
        self.tokenizer = CharTokenizer.for_text(f"{self.word} =", cfg.alphabet)

    @staticmethod
    def transform(s: str) -> str:
        raise NotImplementedError

    @property
    def longest_prompt_text(self) -> str:
        """A prompt as long as any this task makes (a string of ``max_length``):
        what the context-length check measures (:mod:`asyncrl.policy.context_length`)."""
        return f"{self.word} {self.cfg.alphabet[0] * self.cfg.max_length}="
    def length(self, rng: random.Random) -> int:
        """A string length: uniform in [min_length, max_length], or (long_tail)
        lognormal with sigma 1 around median_length, clipped to that range."""
        cfg = self.cfg
        if cfg.lengths == "uniform":
            return rng.randint(cfg.min_length, cfg.max_length)
        n = round(cfg.median_length * math.exp(rng.gauss(0.0, 1.0)))
        return min(max(n, cfg.min_length), cfg.max_length)

    def make_prompt(self, rng: random.Random, position: int) -> tuple[str, str]:
        n = self.length(rng)
        s = "".join(rng.choice(self.cfg.alphabet) for _ in range(n))
        return f"{self.word} {s}=", self.transform(s)

    def prompt_source(self, seed: int) -> SeededPromptSource:
        return SeededPromptSource(
            self.make_prompt, seed=seed, task=self.name, limit=self.cfg.num_prompts
        )

    def reward(self, prompt: Prompt, completion: str) -> float:
        return match_reward(completion, prompt.answer, self.cfg.partial_credit)


class ReverseTask(_StringTask):
    """``"rev abcd="`` -> ``"dcba"``."""

    name = "reverse"
    word = "rev"

    def __init__(self, cfg: ReverseTaskConfig | None = None) -> None:
        super().__init__(cfg or ReverseTaskConfig())

    @staticmethod
    def transform(s: str) -> str:
        return s[::-1]


class SortTask(_StringTask):
    """``"sort dbca="`` -> ``"abcd"``."""

    name = "sort"
    word = "sort"

    def __init__(self, cfg: SortTaskConfig | None = None) -> None:
        super().__init__(cfg or SortTaskConfig())

    @staticmethod
    def transform(s: str) -> str:
        return "".join(sorted(s))
