"""Generation attempts of one prompt group: engine routing, retries, scoring.

:meth:`AttemptRunner.run` is the whole life of a group between its reservation
and its commit. Each attempt goes to the least-loaded healthy engine; a failed
attempt (the engine raised, or the reward raised or timed out) is retried after
an exponential backoff until ``rollout_failure.max_attempts`` attempts were
charged; an attempt lost with a dead engine worker is retried at once and not
charged. What the runner returns tells the dispatcher how the group ended.

Every attempt asks for the group's one start weight (``entry.start_weight``)
and continues the tokens the group already has (``entry.prefix``); a result
that breaks the record's contract (:meth:`~asyncrl.types.GroupResult.problem`)
fails the attempt. The freshest tokens of an attempt are kept on the entry
(``entry.partial``) for checkpoints and stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import NoDeterminism
from asyncrl.controller.entry import Entry, EntryState
from asyncrl.controller.partials import keep_partial
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import (
    BackendLost,
    EngineUnavailable,
    GenerationError,
    GroupAborted,
    RewardError,
)
from asyncrl.tasks.base import Scorer
from asyncrl.types import GenerationRequest, GroupResult, Rollout

log = logging.getLogger("asyncrl.controller")


@dataclasses.dataclass(frozen=True)
class Exhausted:
    """Every attempt the group was allowed failed; ``error`` is the last one's."""

    error: BaseException


class AttemptRunner:
    def __init__(
        self,
        ctx: RunContext,
        engines: Sequence[RolloutEngine],
        scorer: Scorer,
        determinism: NoDeterminism,
        set_state: Callable[[Entry, EntryState], None],
    ) -> None:
        self.ctx = ctx
        self.engines = list(engines)
        self.scorer = scorer
        self.determinism = determinism
        self._set_state = set_state
        #: Attempts running on each engine now (the least-loaded one gets the next).
        self.load = [0] * len(self.engines)

    def pick_engine(self) -> int:
        """The least-loaded engine, skipping engines that report ``healthy = False``
        (a Ray worker being restarted or gone) while any other is healthy."""
        if len(self.engines) == 1:
            return 0
        healthy = [i for i, e in enumerate(self.engines) if getattr(e, "healthy", True)]
        return min(healthy or range(len(self.engines)), key=self.load.__getitem__)

    async def run(self, entry: Entry) -> Rollout | Exhausted | None:
        """Attempts until one succeeds (the rollout), the group runs out of
        attempts (:class:`Exhausted`), or it is aborted (None). Raises on
        cancellation, and :class:`~asyncrl.errors.BackendLost` when no engine is left."""
        rf = self.ctx.cfg.rollout_failure
        while True:
            entry.attempts += 1
            self.ctx.ledger.set_attempts(entry.group_id, entry.attempts)
            try:
                rollout = await self._attempt(entry)
            except (asyncio.CancelledError, GroupAborted) as exc:
                if entry.aborted:
                    return None
                if entry.stopping and isinstance(exc, GroupAborted):
                    keep_partial(entry, exc.partial, self.ctx.grpo.num_generations_per_prompt)
                    return None
                raise
            except BackendLost:
                raise  # no engine is left to retry on: the run fails
            except EngineUnavailable as exc:
                # The engine's worker died, not the group: retry at once on
                # another engine, without charging the group's failure budget.
                entry.lost += 1
                log.warning("group %s attempt %d lost with engine %s (%s); retrying",
                            entry.group_id, entry.attempts, entry.engine, exc)
                continue
            except Exception as exc:
                entry.partial = None  # the retry continues from the prefix again
                charged = entry.attempts - entry.lost
                if charged >= rf.max_attempts:
                    return Exhausted(exc)
                delay = min(rf.backoff_s * 2 ** (charged - 1), rf.max_backoff_s)
                log.warning("group %s attempt %d failed (%s); retrying in %.2fs",
                            entry.group_id, entry.attempts, exc, delay)
                self._set_state(entry, EntryState.BACKOFF)
                await asyncio.sleep(delay)  # exponential backoff, not a poll
                self._set_state(entry, EntryState.GENERATING)
                continue
            return rollout

    async def _attempt(self, entry: Entry) -> Rollout:
        ctx = self.ctx
        idx = self.pick_engine()
        entry.engine = idx
        request = GenerationRequest(
            group_id=entry.group_id,
            prompt=entry.prompt,
            num_generations=ctx.grpo.num_generations_per_prompt,
            attempt=entry.attempts,
            seed=self.determinism.seed(entry.group_id),
            weight_version=entry.pin,
            start_weight=entry.start_weight,
            prefix=entry.prefix,
        )
        start = ctx.now()
        outcome = "failed"
        self.load[idx] += 1
        try:
            result = await self.engines[idx].generate(request)
            outcome = "ok"
        except (asyncio.CancelledError, GroupAborted):
            outcome = "aborted"
            raise
        except EngineUnavailable:
            outcome = "lost"
            raise
        finally:
            self.load[idx] -= 1
            ctx.timeline.add("gen", idx, start, ctx.now(), outcome)
        problem = result.problem(start_weight=entry.start_weight,
                                 num_generations=request.num_generations)
        if problem is not None:
            raise GenerationError(
                f"engine {type(self.engines[idx]).__name__} returned an invalid result for group "
                f"{entry.group_id!r}: {problem}. Fix the engine (see asyncrl.record)")
        entry.partial = result  # kept by a checkpoint or a stop while it is scored
        tokens, longest = _token_counts(result)
        ctx.ledger.generated(entry.group_id, start=start, end=ctx.now(), tokens=tokens,
                             longest=longest)
        rewards = result.rewards
        if rewards is None:
            self._set_state(entry, EntryState.SCORING)
            rewards = await self.scorer.score(entry.prompt, result.completion_texts)
        return Rollout(entry.group_id, entry.prompt, result,
                       _checked_rewards(rewards, result), entry.stamp, entry.attempts)


def _token_counts(result: GroupResult) -> tuple[int, int]:
    """All completion tokens of a group, and those of its longest completion
    (one record shared by several completions is measured once)."""
    tokens = longest = size = 0
    last = None
    for c in result.completions:
        if c is not last:
            last, size = c, len(c)
            longest = max(longest, size)
        tokens += size
    return tokens, longest


def _checked_rewards(rewards: Sequence[float], result: GroupResult) -> list[float]:
    # Anything float() takes as a number (numpy and 0-d torch scalars too), but
    # not text: float("1") would hide a reward function returning strings.
    wrong = [r for r in rewards if isinstance(r, (str, bytes)) or not hasattr(r, "__float__")]
    if wrong:
        raise RewardError(f"reward {wrong[0]!r} ({type(wrong[0]).__name__}) is not a number; "
                          "return a float")
    out = [float(r) for r in rewards]
    if len(out) != len(result.completion_ids):
        raise RewardError(
            f"got {len(out)} rewards for {len(result.completion_ids)} completions; a reward "
            "function returns one float per completion"
        )
    bad = [r for r in out if not math.isfinite(r)]
    if bad:
        raise RewardError(f"reward {bad[0]!r} is not a finite number; return a float")
    return out
