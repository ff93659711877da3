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
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import ConfigError
from asyncrl.tasks.base import Scorer, Task
from asyncrl.tasks.capabilities import HasRecords, TaskCapabilities, records_path
from asyncrl.types import GenerationRequest, Prompt

if TYPE_CHECKING:
    from asyncrl.config import EvalConfig, TaskConfig
    from asyncrl.policy.build import PolicyTokenizer

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


#: Offset of the seed of a built-in task's held-out stream from the run seed.
EVAL_SEED_OFFSET = 1_000_003


def eval_metrics(ev: EvalConfig | None) -> list[str]:
    """The ``eval/...`` metrics an evaluation of ``ev`` logs (none without one)."""
    if ev is None:
        return []
    names = ["eval/reward_mean", "eval/num_prompts"]
    if ev.num_generations > 1:
        names += ["eval/pass@1", f"eval/pass@{ev.num_generations}"]
    return names


def build_evaluation(ev: EvalConfig | None, task: Task, *, task_cfg: TaskConfig, seed: int,
                     tokenizer: PolicyTokenizer) -> tuple[Task, Evaluator | None]:
    """The task to train on and the :class:`Evaluator` of the ``eval`` block
    ``ev`` (None without one), for ``task`` built from the ``task`` block
    ``task_cfg`` (whose ``reward`` configures the scorer), or by the caller.

    For a task over the records of a file (the dataset task,
    :class:`~asyncrl.tasks.capabilities.HasRecords`) the held-out records come from ``eval.path`` or are the
    last ``eval.holdout`` records of the training file, which the returned
    training task then leaves out. A from-scratch model's character vocabulary
    covers the held-out prompts too (they are added to ``task.extra_chars``).
    A chat template formats the held-out prompts with ``tokenizer`` (the
    policy's); a built-in task's held-out stream is seeded from ``seed`` (the
    run's).
    """
    from asyncrl.policy.build import bind_task_tokenizer
    from asyncrl.tasks import build_scorer, build_task

    if ev is None:
        return task, None
    _warn_about(ev, task)
    if not TaskCapabilities.of(task).records:
        if ev.path is not None or ev.holdout is not None:
            raise ConfigError(
                "eval.path and eval.holdout name held-out records of a dataset task; this task "
                f"({task.name}) generates its prompts, and evaluates on a seeded stream of its "
                "own. Remove eval.path / eval.holdout")
        source = task.prompt_source(seed + EVAL_SEED_OFFSET)
        prompts = [p for p in (source.next_prompt() for _ in range(ev.num_prompts)) if p]
        return task, Evaluator(prompts, build_scorer(task, task_cfg), _settings(ev))
    records = cast(HasRecords, task)
    eval_task, indices = _held_out(ev, records)
    chars = "".join(sorted({c for i in indices
                            for c in eval_task.raw_prompt(i) + str(eval_task.answer(i) or "")}))
    train_cfg = records.cfg.model_copy(update={"extra_chars": records.cfg.extra_chars + chars})
    if ev.holdout is not None:
        train_cfg = train_cfg.model_copy(update={"max_prompts": records.num_records - ev.holdout})
    task = build_task(train_cfg)
    bind_task_tokenizer(eval_task, tokenizer)  # a chat template formats eval prompts too
    prompts = [eval_task.make_prompt(i, position=j, epoch=0) for j, i in enumerate(indices)]
    return task, Evaluator(prompts, build_scorer(eval_task, eval_task.cfg), _settings(ev))


def _held_out(ev: EvalConfig, task: HasRecords) -> tuple[Any, list[int]]:
    from asyncrl.tasks import build_task

    if ev.path is not None:
        eval_task = build_task(task.cfg.model_copy(update={"path": ev.path, "max_prompts": None}))
        return eval_task, list(range(min(ev.num_prompts, eval_task.num_records)))
    if ev.holdout is None:
        raise ConfigError(
            "eval on a dataset task needs held-out records: eval.path (a file of them) or "
            "eval.holdout (that many records at the end of the training file, kept out of "
            "training)")
    if ev.holdout >= task.num_records:
        raise ConfigError(
            f"eval.holdout={ev.holdout} leaves no training records: the training file has "
            f"{task.num_records}; hold out fewer")
    first = task.num_records - ev.holdout
    return task, list(range(first, first + min(ev.holdout, ev.num_prompts)))


def _warn_about(ev: EvalConfig, task: Task) -> None:
    """Settings that make the eval numbers mean less than they seem (warnings:
    each can be meant, e.g. by a docs example with ten records)."""
    train_path = records_path(task)
    if ev.path is not None and train_path is not None and \
            Path(ev.path).expanduser().resolve() == Path(train_path).expanduser().resolve():
        log.warning(
            "eval.path is the training file (task.path=%s): the held-out prompts are training "
            "prompts, so eval measures recall, not generalisation. Point eval.path at a "
            "held-out file, or use eval.holdout: N to keep N records out of training", train_path)
    if ev.temperature == 0 and ev.num_generations > 1:
        n = ev.num_generations
        log.warning(
            "eval.temperature=0 (greedy) with eval.num_generations=%d: the %d completions of a "
            "prompt are identical, so eval/pass@%d equals eval/pass@1. Set eval.temperature > 0 "
            "(e.g. 1.0) to sample them, or eval.num_generations: 1", n, n, n)


def _settings(ev: EvalConfig) -> EvalSettings:
    return EvalSettings(every_steps=ev.every_steps, num_generations=ev.num_generations,
                        temperature=ev.temperature, max_new_tokens=ev.max_new_tokens,
                        pass_threshold=ev.pass_threshold)
