"""``RolloutFunctionEngine``: a rollout function run as the group's generation.

The controller calls an engine's ``generate`` once per attempt of a prompt
group and scores the texts unless the result carries rewards. A rollout
function (``task.rollout``) replaces that single turn: this wrapper is the
:class:`~asyncrl.engines.RolloutEngine` the controller sees, and its
``generate`` runs the function over an :class:`~asyncrl.rollouts.EngineSession`
on the engine it wraps, returning the function's record and rewards as the
group's result. The controller cannot tell it from an engine, so retries,
deadlines (``generation_timeout_s`` bounds the whole rollout), aborts, the
ledger and evaluation work unchanged.

Failures inside the function are classified like any other
(:class:`~asyncrl.errors.RolloutFailure`, docs/controller.md): an error that
says ``infra`` or ``data`` (the engine's own, or one the function raises on
purpose) passes through and is retried; any other exception is a bug of the
function: raised as :class:`RolloutFunctionError` naming it, not retried, and
the run stops with a checkpoint.

A group stopped or aborted mid-rollout is generated again from its prompt on
resume: an environment's state cannot be restored from tokens, so the wrapper
keeps no partial (no ``snapshot``, ``GroupAborted.partial`` None) and ignores
a request's ``prefix``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from asyncrl._util.text import plural
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.classify import encode_prompt_or_fail
from asyncrl.errors import (
    AsyncRLError,
    BackendLost,
    EngineRewardError,
    GroupAborted,
    failure_kind,
)
from asyncrl.rollouts.output import RolloutOutput
from asyncrl.rollouts.session import EngineBug, EngineSession, RolloutContractError, RolloutSession
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.types import GenerationRequest, GroupId, GroupResult, Prompt

RolloutFunction = Callable[[Prompt, RolloutSession], Awaitable[RolloutOutput]]


class RolloutFunctionError(AsyncRLError, RuntimeError):
    """A rollout function raised an error that says neither infra nor data, or
    returned something that is not a valid record: a bug in the function."""


class RolloutFunctionEngine:
    """Runs ``fn`` (named ``name`` in errors) on ``engine`` for every group."""

    def __init__(self, engine: RolloutEngine, fn: RolloutFunction, tokenizer: Tokenizer, *,
                 name: str) -> None:
        self.engine = engine
        self.fn = fn
        self.tokenizer = tokenizer
        self.name = name
        self._running: dict[GroupId, asyncio.Task[RolloutOutput]] = {}
        self._aborted: set[GroupId] = set()

    # The wrapped engine's optional members (``healthy``, ``device``, pinned
    # versions...) are its own; only ``snapshot`` is not offered (see above).
    def __getattr__(self, name: str) -> Any:
        if name == "snapshot" or name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.engine, name)

    @property
    def weight_version(self) -> int:
        return self.engine.weight_version

    async def generate(self, request: GenerationRequest) -> GroupResult:
        session = EngineSession(self.engine, request, self.tokenizer)
        task = asyncio.ensure_future(self.fn(request.prompt, session))
        self._running[request.group_id] = task
        try:
            output = await task  # cancelling the caller cancels the rollout too
        except (asyncio.CancelledError, GroupAborted) as exc:
            if request.group_id in self._aborted or isinstance(exc, GroupAborted):
                # Aborted: no partial, the group starts again from its prompt.
                raise GroupAborted(f"group {request.group_id!r} aborted") from None
            raise
        except Exception as exc:
            if failure_kind(exc) is not None or isinstance(exc, BackendLost):
                raise  # classified (infra / data), or nothing left to retry on
            if isinstance(exc, EngineBug):  # the engine's bug, not the function's
                raise exc.__cause__ from None
            raise self._bug(f"raised {type(exc).__name__}: {exc}", request) from exc
        finally:
            if self._running.get(request.group_id) is task:
                del self._running[request.group_id]
                self._aborted.discard(request.group_id)
        return self._result(request, session, output)

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.engine.update_weights(weights, version)

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        # The turn in flight stops in the engine; an environment step stops here.
        await self.engine.abort(group_ids)
        for gid in group_ids:
            task = self._running.get(gid)
            if task is not None and not task.done():
                self._aborted.add(gid)
                task.cancel()

    async def invalidate_cache(self) -> None:
        await self.engine.invalidate_cache()

    async def close(self) -> None:
        await self.engine.close()

    # ------------------------------------------------------------ internals
    def _bug(self, what: str, request: GenerationRequest) -> RolloutFunctionError:
        # The controller adds the group, prompt and attempt, and stops the run.
        return RolloutFunctionError(
            f"the rollout function task.rollout={self.name!r} {what}; a failure a rollout "
            "function expects raises an asyncrl.errors.RolloutFailure (GenerationError: "
            "infra, retried with backoff; PromptError or RewardError: data, retried)")

    def _result(self, request: GenerationRequest, session: EngineSession,
                output: Any) -> GroupResult:
        if not isinstance(output, RolloutOutput):
            raise self._bug(f"returned {type(output).__name__}; return "
                            "asyncrl.rollouts.RolloutOutput(completions, rewards)", request)
        completions = list(output.completions)
        n = request.num_generations
        if len(completions) != n:
            raise self._bug(f"returned {plural(len(completions), 'completion')}; the group "
                            f"needs {n} "
                            "(session.num_generations)", request)
        try:
            session.check_made(completions, "the returned RolloutOutput")
        except RolloutContractError as exc:
            raise self._bug(str(exc), request) from None
        unfinished = [i for i, c in enumerate(completions) if not c.finished]
        if unfinished:
            raise self._bug(f"returned unfinished transcripts {unfinished}; end each with "
                            "session.finish(transcript) before returning it", request)
        prompt_ids = (session.prompt_ids if session.prompt_ids is not None
                      else encode_prompt_or_fail(self.tokenizer, request.prompt))
        rewards = None if output.rewards is None else list(output.rewards)
        if rewards is not None and len(rewards) != n:
            raise self._bug(f"returned {plural(len(rewards), 'reward')} for "
                            f"{plural(n, 'completion')}; return one "
                            "per completion (or rewards=None: the task's reward scores them)",
                            request)
        bad = next((i for i, r in enumerate(rewards or ()) if not _finite_number(r)), None)
        if bad is not None:  # data, as a reward function's would be: retried
            raise EngineRewardError(
                f"the rollout function task.rollout={self.name!r} returned reward "
                f"{rewards[bad]!r} for completion {bad}; return a finite float per completion "
                "(or rewards=None: the task's reward scores them)")
        return GroupResult(request.group_id, prompt_ids, completions, session.start_weight,
                           rewards)


def _finite_number(reward: Any) -> bool:
    """A number (not text: float("1") would hide a function returning strings) that is finite."""
    if isinstance(reward, (str, bytes)):
        return False
    try:
        return math.isfinite(float(reward))
    except (TypeError, ValueError):
        return False


def with_rollout_function(engines: Sequence[RolloutEngine], fn: RolloutFunction,
                          tokenizer: Tokenizer, *, name: str) -> list[RolloutEngine]:
    """Every engine wrapped to run ``fn`` (what ``task.rollout`` does to a run's engines)."""
    return [RolloutFunctionEngine(e, fn, tokenizer, name=name) for e in engines]


__all__ = ["RolloutFunction", "RolloutFunctionEngine", "RolloutFunctionError",
           "with_rollout_function"]
