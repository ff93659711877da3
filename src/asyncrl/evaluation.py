"""Evaluation on held-out prompts while training runs.

Every ``every_steps`` training steps, right after the weight sync, the train
pump asks the :class:`Evaluator` to generate ``num_generations`` completions for
each held-out prompt with the weights the engines now hold, score them and
report ``eval/reward_mean`` (and ``eval/pass@1`` / ``eval/pass@k`` when
``num_generations > 1``) in that step's metrics. The eval groups go to the same
engines as the rollouts and run alongside them: the rollout side keeps going,
and the train pump waits only for the eval itself.

Eval groups never touch the buffer, the sampler or the ledger.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.engines.base import RolloutEngine
from asyncrl.tasks.base import Scorer
from asyncrl.types import GenerationRequest, Prompt

log = logging.getLogger("asyncrl.eval")


def pass_at_k(n: int, correct: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``correct`` passed: the chance
    that at least one of ``k`` samples drawn without replacement passes."""
    if n - correct < k:
        return 1.0
    return 1.0 - math.prod((n - correct - i) / (n - i) for i in range(k))


@dataclass(frozen=True)
class EvalSettings:
    every_steps: int
    num_generations: int = 1
    #: Sampling temperature of the eval completions (0: greedy).
    temperature: float = 0.0
    max_new_tokens: int | None = None
    #: A completion passes when its reward is at least this (for pass@k).
    pass_threshold: float = 1.0


class Evaluator:
    """Scores held-out ``prompts`` with the engines' current weights."""

    def __init__(self, prompts: Sequence[Prompt], scorer: Scorer, settings: EvalSettings) -> None:
        if not prompts:
            raise ValueError("an Evaluator needs at least one held-out prompt")
        self.prompts = list(prompts)
        self.scorer = scorer
        self.settings = settings

    def due(self, version: int) -> bool:
        """Called by the train pump after each weight sync to version ``version``."""
        return version % self.settings.every_steps == 0

    async def evaluate(self, engines: Sequence[RolloutEngine], version: int) -> dict[str, float]:
        """Generate and score every held-out prompt (spread over the engines,
        concurrently); returns the ``eval/...`` metrics. An eval that fails is
        logged and reported as missing, never fatal to the training run."""
        s = self.settings
        try:
            groups = await asyncio.gather(*(
                self._one(engines[i % len(engines)], prompt, version, i)
                for i, prompt in enumerate(self.prompts)))
        except Exception as exc:
            log.warning("evaluation at version %d failed (%r); training goes on", version, exc)
            return {}
        rewards = [r for group in groups for r in group]
        metrics = {"eval/reward_mean": sum(rewards) / len(rewards),
                   "eval/num_prompts": float(len(groups))}
        if s.num_generations > 1:
            passed = [sum(r >= s.pass_threshold for r in group) for group in groups]
            n = s.num_generations
            metrics["eval/pass@1"] = sum(pass_at_k(n, c, 1) for c in passed) / len(groups)
            metrics[f"eval/pass@{n}"] = sum(pass_at_k(n, c, n) for c in passed) / len(groups)
        return metrics

    async def _one(self, engine: RolloutEngine, prompt: Prompt, version: int,
                   index: int) -> list[float]:
        s = self.settings
        request = GenerationRequest(
            group_id=("eval", version, index), prompt=prompt, num_generations=s.num_generations,
            temperature=s.temperature, max_new_tokens=s.max_new_tokens)
        result = await engine.generate(request)
        if result.rewards is not None:
            return list(result.rewards)
        return await self.scorer.score(prompt, result.completion_texts)
