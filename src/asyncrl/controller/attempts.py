"""Generation attempts of one prompt group: engine routing, retries, scoring.

:meth:`AttemptRunner.run` is the whole life of a group between its reservation
and its commit. Each attempt goes to the least-loaded healthy engine. How a
failed attempt is handled is decided by the error, which the component that
raised it classified (:class:`~asyncrl.errors.RolloutFailure`, docs/controller.md):

* ``infra`` (engine, worker, transport, a deadline): retried after an
  exponential backoff, on another engine when there is one, until
  ``max_infra_attempts_per_prompt`` infra failures;
* ``data`` (reward, task, tokenizer): retried at once, until
  ``max_data_attempts_per_prompt`` data failures (the two budgets are independent);
* :class:`~asyncrl.errors.EngineUnavailable` (the worker died under the
  attempt): retried at once elsewhere, charged to no budget;
* :class:`~asyncrl.errors.BackendLost` (nothing left to retry on): raised;
* anything else is a bug: not retried, reported as :class:`Fatal` naming the
  component (the engine's or scorer's class), and the run stops.

An error raised while the group is being aborted (or cancelled at the end of
the run) is never a failed attempt: the group is already accounted for. A bug
is still reported (:class:`Fatal`), a classified error only logged.

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
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from asyncrl._util.text import plural, qualified_name
from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import NoDeterminism
from asyncrl.controller.entry import Entry, EntryState
from asyncrl.controller.failure_log import blame, error_line, failure_key
from asyncrl.controller.partials import continue_from, keep_partial
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import (
    BackendBug,
    BackendLost,
    EngineLeft,
    EngineRewardError,
    EngineUnavailable,
    FailureKind,
    GenerationTimeout,
    GroupAborted,
    RewardError,
    RewardTimeout,
    failure_kind,
)
from asyncrl.record import counted
from asyncrl.tasks.base import Scorer
from asyncrl.types import GenerationRequest, GroupResult, Rollout, prompt_label

log = logging.getLogger("asyncrl.controller")
diagnostics_log = logging.getLogger("asyncrl.diagnostics")

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Exhausted:
    """The group used up one of its budgets; ``error`` is the last failure."""

    kind: FailureKind
    error: BaseException
    #: The failure's kind (:func:`~asyncrl.controller.failure_log.failure_key`).
    key: str = ""


@dataclasses.dataclass(frozen=True)
class Fatal:
    """An error that stops the run (a bug in a component, named in ``error``);
    ``key``: its kind (:func:`~asyncrl.controller.failure_log.failure_key`), the
    same for the same bug hitting other groups, which are then reported with it."""

    error: BaseException
    key: str


def _preview(text: str, width: int = 60) -> str:
    return repr(text if len(text) <= width else text[: width - 1] + "…")


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

    def pick_engine(self, avoid: int | None = None) -> int:
        """The least-loaded engine, skipping engines that report ``healthy = False``
        (a Ray worker being restarted or gone) while any other is healthy, and
        ``avoid`` (where the group's last attempt failed as infra) while any
        other healthy engine is left."""
        if len(self.engines) == 1:
            return 0
        caps = self.ctx.capabilities
        healthy = [i for i, e in enumerate(self.engines) if not caps[i].healthy or e.healthy]
        elsewhere = [i for i in healthy if i != avoid]
        return min(elsewhere or healthy or range(len(self.engines)), key=self.load.__getitem__)

    async def run(self, entry: Entry) -> Rollout | Exhausted | Fatal | None:
        """Attempts until one succeeds (the rollout), a budget runs out
        (:class:`Exhausted`), a component shows a bug (:class:`Fatal`), or the
        group is aborted (None). Raises on cancellation, and
        :class:`~asyncrl.errors.BackendLost` when no engine is left."""
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
            except Exception as exc:
                if entry.aborted or entry.stopping or _being_cancelled():
                    return self._while_cancelled(entry, exc)
                entry.partial = None  # a retry continues from the prefix again
                if isinstance(exc, BackendLost):
                    raise  # no engine is left to retry on: the run fails
                kind = failure_kind(exc)
                if kind is None:
                    return self._bug(entry, exc)
                if isinstance(exc, EngineUnavailable):
                    # The engine's worker died (or left the fleet), not the group:
                    # retry at once on another engine, without charging the
                    # group's budgets; a leaving engine hands its tokens over.
                    entry.lost += 1
                    if isinstance(exc, EngineLeft):
                        continue_from(entry, exc.partial,
                                      self.ctx.grpo.num_generations_per_prompt)
                    log.warning("group %s attempt %d lost with engine %s (%s); retrying",
                                entry.group_id, entry.attempts, entry.engine, exc)
                    continue
                self._note_failure(entry, exc, kind)
                who = self.blame(entry, exc)
                key = failure_key(exc, who, entry.group_id, entry.prompt.prompt_id)
                if kind == "data":
                    entry.data_failures += 1
                    if entry.data_failures >= rf.max_data_attempts_per_prompt:
                        return Exhausted("data", exc, key)
                    self.ctx.failures.warn(
                        "retried", key, entry.group_id, "group %s attempt %d failed as data in "
                        "%s (%s); retrying", entry.group_id, entry.attempts, who, exc)
                    continue
                entry.infra_failures += 1
                if entry.infra_failures >= rf.max_infra_attempts_per_prompt:
                    return Exhausted("infra", exc, key)
                entry.avoid = entry.engine
                delay = rf.backoff(entry.infra_failures)
                self.ctx.failures.warn(
                    "retried", key, entry.group_id, "group %s attempt %d failed as infra in %s "
                    "(%s); retrying in %.2fs", entry.group_id, entry.attempts, who, exc, delay)
                self._set_state(entry, EntryState.BACKOFF)
                await asyncio.sleep(delay)  # exponential backoff, not a poll
                self._set_state(entry, EntryState.GENERATING)
                continue
            if self.ctx.cfg.diagnostics:
                self._diagnose(entry, rollout)
            return rollout

    # ---------------------------------------------------------- one attempt
    async def _attempt(self, entry: Entry) -> Rollout:
        ctx = self.ctx
        native = ctx.cfg.rollout_failure.native
        if entry.state is not EntryState.GENERATING:  # a retry after a failed scoring
            self._set_state(entry, EntryState.GENERATING)
        idx = 0 if len(self.engines) == 1 else self.pick_engine(entry.avoid)
        entry.engine = idx
        engine = self.engines[idx]
        determinism = self.determinism
        # Every field positionally, in GenerationRequest's order (group_id, prompt,
        # num_generations, attempt, seed, weight_version, temperature, top_p,
        # max_new_tokens, start_weight, prefix): keywords make the frozen
        # dataclass's __init__ call cost 1.6x as much, once per attempt.
        request = GenerationRequest(
            entry.group_id, entry.prompt, ctx.grpo.num_generations_per_prompt, entry.attempts,
            determinism.seed(entry.group_id) if determinism.enabled else None, entry.pin,
            None, None, None, entry.start_weight, entry.prefix)
        start = ctx.now()
        outcome = "failed"
        self.load[idx] += 1
        ctx.stats.generation_changed(start, +1)
        limit = native.generation_timeout_s
        try:
            if limit is None:  # no deadline: no wrapper coroutine on the hot path
                result = await engine.generate(request)
            else:
                result = await _deadline(
                    engine.generate(request), limit,
                    lambda: GenerationTimeout(
                        f"engine {idx} ({type(engine).__name__}) generated group "
                        f"{entry.group_id!r} for longer than async_rl.rollout_failure.native."
                        f"generation_timeout_s={limit:g}s"))
            outcome = "ok"
        except (asyncio.CancelledError, GroupAborted):
            outcome = "aborted"
            raise
        except EngineUnavailable:
            outcome = "lost"
            raise
        finally:
            self.load[idx] -= 1
            end = ctx.now()
            ctx.stats.generation_changed(end, -1)
            ctx.timeline.add("gen", idx, start, end, outcome)
        tokens, longest, entry.end_weight = _checked_counts(result, entry.start_weight,
                                                            request.num_generations)
        if ctx.vocab_size is not None:
            _check_vocabulary(result, ctx.vocab_size)
        entry.partial = result  # kept by a checkpoint or a stop while it is scored
        ctx.ledger.generated(entry.group_id, start=start, end=end, tokens=tokens,
                             longest=longest)
        # A continued group's result holds the tokens it had before: not generated now.
        ctx.stats.tokens_generated(
            tokens - (_token_counts(entry.prefix)[0] if entry.prefix is not None else 0))
        rewards = result.rewards
        if rewards is not None:  # the engine's (a rollout function's): it is named
            try:
                checked = _checked_rewards(rewards, result)
            except RewardError as exc:
                raise EngineRewardError(f"engine {idx} ({qualified_name(engine)}) returned "
                                        f"rewards with the group: {exc}") from None
            return Rollout(entry.group_id, entry.prompt, result, checked, entry.stamp,
                           entry.attempts)
        self._set_state(entry, EntryState.SCORING)
        score = self.scorer.score(entry.prompt, result.completion_texts)
        env_limit = native.env_timeout_s
        rewards = await (score if env_limit is None else _deadline(
            score, env_limit,
            lambda: RewardTimeout(
                f"scoring group {entry.group_id!r} took longer than async_rl."
                f"rollout_failure.native.env_timeout_s={env_limit:g}s")))
        return Rollout(entry.group_id, entry.prompt, result,
                       _checked_rewards(rewards, result), entry.stamp, entry.attempts)

    # ------------------------------------------------------------- failures
    def blame(self, entry: Entry, exc: BaseException) -> str:
        """The component a failure of ``entry``'s attempt is charged to, in words."""
        engine = self.engines[entry.engine or 0]
        return blame(exc, engine=f"engine {entry.engine} ({qualified_name(engine)})",
                     scoring=entry.state is EntryState.SCORING,
                     scorer=f"the scorer {qualified_name(self.scorer)}")

    def _note_failure(self, entry: Entry, exc: BaseException, kind: str) -> None:
        """The group's ledger record keeps the error of its last failed attempt,
        and where its prompt came from: a group a stop puts back (pending) says
        in ledger.jsonl why it did not finish. Failures only: no cost per group."""
        self.ctx.ledger.attempt_failed(entry.group_id, error=error_line(exc), kind=kind,
                                       source=entry.prompt.meta.get("source"))

    def _bug(self, entry: Entry, exc: BaseException) -> Fatal:
        """Name the component that raised an unclassified error: the engine of
        the attempt, or the scorer when it failed while scoring."""
        who = self.blame(entry, exc)
        if entry.state is EntryState.SCORING:
            contract = "a Scorer raises asyncrl.errors.RewardError (data) or RewardTimeout (infra)"
        else:
            contract = ("an engine raises asyncrl.errors.GenerationError (infra) or "
                        "PromptError (data) for a failure it expects")
        where = (f"group {entry.group_id!r}, {prompt_label(entry.prompt)}, "
                 f"attempt {entry.attempts}")
        if isinstance(exc, ResultContractError):
            what = (f"{who} {exc} ({where}). A result that breaks the engine's contract is a "
                    "bug in the engine and is not retried")
        else:
            what = (f"{who} raised {type(exc).__name__}: {exc} ({where}). An error that says "
                    "neither infra nor data is a bug in that component and is not retried "
                    f"({contract})")
        error = BackendBug(f"{what}. Fix it, then resume the run from its checkpoint")
        error.__cause__ = exc
        self._note_failure(entry, error, "bug")
        return Fatal(error, failure_key(exc, who, entry.group_id, entry.prompt.prompt_id))

    def _while_cancelled(self, entry: Entry, exc: BaseException) -> Fatal | None:
        """An error raised while the group was being aborted (or cancelled because
        the run ends): never a failed attempt, the group is accounted for already
        (aborted, or pending). A bug is still reported (as the same kind as the
        bug outside a cancellation); a classified error is logged, once per kind
        while aborting, and only at debug level at the end of the run (it stopped
        for a reason reported already; the group stays pending for a resume)."""
        doing = "aborted" if entry.aborted else "cancelled at the end of the run"
        if failure_kind(exc) is None and not isinstance(exc, BackendLost):
            bug = self._bug(entry, exc)
            return Fatal(BackendBug(f"while group {entry.group_id!r} was being {doing}: "
                                    f"{bug.error}"), bug.key)
        message = "group %s raised %r while being %s; it was %s anyway"
        args = (entry.group_id, exc, doing, doing.split(" ")[0])
        if entry.aborted:
            key = failure_key(exc, self.blame(entry, exc), entry.group_id, entry.prompt.prompt_id)
            self.ctx.failures.warn("raised while aborted", key, entry.group_id, message, *args)
        else:
            log.debug(message, *args)
        return None

    def _diagnose(self, entry: Entry, rollout: Rollout) -> None:
        result = rollout.result
        completions = ", ".join(_preview(t, 40) for t in result.completion_texts[:4])
        more = len(result.completion_texts) - 4
        diagnostics_log.info(
            "group %s prompt %s attempt %d weights %d->%d rewards [%s] prompt %s completions "
            "[%s%s]", entry.group_id, entry.prompt.prompt_id, entry.attempts,
            result.start_weight, result.end_weight,
            ", ".join(f"{r:.3g}" for r in rollout.rewards), _preview(entry.prompt.text),
            completions, f", +{more} more" if more > 0 else "")


def _being_cancelled() -> bool:
    """True while this task is being cancelled (the run is failing): an error
    raised meanwhile is not a failed attempt. (Python 3.11+; 3.10 relies on
    the flags the dispatcher sets.)"""
    current = asyncio.current_task()
    cancelling = getattr(current, "cancelling", None)  # an asyncio.Task's, on 3.11+
    return bool(cancelling is not None and cancelling())


async def _deadline(call: Awaitable[T], seconds: float | None,
                    expired: Callable[[], BaseException]) -> T:
    """Await ``call``; past ``seconds`` (None: no limit) it is cancelled and
    ``expired()`` raised. A TimeoutError the call raises itself passes through."""
    if seconds is None:
        return await call
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        return await asyncio.wait_for(call, seconds)
    except asyncio.TimeoutError:
        if loop.time() - start < seconds:
            raise
        raise expired() from None


class ResultContractError(ValueError):
    """What an engine's ``generate`` returned breaks the record's contract; the
    message says what it returned (the engine's bug: reported as BackendBug,
    naming the engine, not retried)."""


def _checked_counts(result: GroupResult, start_weight: int, n: int) -> tuple[int, int, int]:
    """:func:`_token_counts` of an engine's finished result and its end weight,
    checked against the record's contract on the way
    (:meth:`~asyncrl.types.GroupResult.problem`, which names what is wrong).
    Unclassified on purpose: a result that breaks the contract is a bug of the
    engine (reported as BackendBug, naming it), not a retry."""
    if not isinstance(result, GroupResult):
        raise ResultContractError(
            f"returned {type(result).__name__} from generate; return an "
            "asyncrl.types.GroupResult(group_id, prompt_ids, completions, start_weight)")
    completions = result.completions
    if result.start_weight == start_weight and len(completions) == n:
        # counted()'s test for one record shared by every completion, inline:
        # this runs once per attempt of every group.
        c = completions[0] if n else None
        if c is not None and c is completions[-1] and completions.count(c) == n:
            spans = c.versions
            if c.finish_reason is not None and not (spans and spans[0][0] < start_weight):
                size = len(c.token_ids)
                return size * n, size, spans[-1][0] if spans and spans[-1][0] > start_weight \
                    else start_weight
        else:
            tokens = longest = 0
            end = start_weight
            for c, times in counted(completions):
                spans = c.versions
                if c.finish_reason is None or (spans and spans[0][0] < start_weight):
                    break
                size = len(c.token_ids)
                tokens += size * times
                if size > longest:
                    longest = size
                if spans and spans[-1][0] > end:
                    end = spans[-1][0]
            else:
                return tokens, longest, end
    problem = result.problem(start_weight=start_weight, num_generations=n)
    if problem is not None:
        raise ResultContractError(f"returned an invalid result: {problem} (see asyncrl.record)")
    return (*_token_counts(result), result.end_weight)


def _check_vocabulary(result: GroupResult, size: int) -> None:
    """Every token id of ``result`` indexes the policy's embedding of ``size``
    rows. Checked here, where the engine is known: an id past it would fail
    deep in the trainer's forward (an IndexError naming neither the engine nor
    the group), and with a half-done step. Unclassified: the engine's bug."""
    for where, ids in (("its prompt ids", result.prompt_ids),
                       *((f"completion {i}", c.token_ids)
                         for i, c in enumerate(result.completions))):
        if ids and not (min(ids) >= 0 and max(ids) < size):
            bad = next(t for t in ids if not 0 <= t < size)
            raise ValueError(f"it returned token id {bad} in {where}, outside the policy's "
                             f"vocabulary of {size} ids (0 to {size - 1})")


def _token_counts(result: GroupResult) -> tuple[int, int]:
    """All completion tokens of a group, and those of its longest completion
    (one record shared by several completions is measured once)."""
    tokens = longest = 0
    for c, times in counted(result.completions):
        size = len(c.token_ids)
        tokens += size * times
        if size > longest:
            longest = size
    return tokens, longest


#: Reward types taken as they are (converted with ``float``, checked finite).
_PLAIN_REWARDS = frozenset({float, int})


def _checked_rewards(rewards: Sequence[float], result: GroupResult) -> list[float]:
    n = len(result.completions)
    # Plain numbers, one per completion (what simulated engines and most reward
    # functions give): converted and checked in C. A float sum is finite only if
    # every term is (an overflow to inf falls through to the full check).
    if len(rewards) == n and set(map(type, rewards)) <= _PLAIN_REWARDS:
        out = list(map(float, rewards))
        if math.isfinite(sum(out)):
            return out
    # Anything float() takes as a number (numpy and 0-d torch scalars too), but
    # not text: float("1") would hide a reward function returning strings.
    wrong = [r for r in rewards if isinstance(r, (str, bytes)) or not hasattr(r, "__float__")]
    if wrong:
        raise RewardError(f"reward {wrong[0]!r} ({type(wrong[0]).__name__}) is not a number; "
                          "return a float")
    out = [float(r) for r in rewards]
    if len(out) != n:
        raise RewardError(
            f"got {plural(len(out), 'reward')} for {plural(n, 'completion')}; a reward "
            "function returns one float per completion"
        )
    bad = [r for r in out if not math.isfinite(r)]
    if bad:
        raise RewardError(f"reward {bad[0]!r} is not a finite number; return a float")
    return out
