"""Reward functions: the built-ins and loading a custom one.

Every reward function has the contract of a custom one::

    fn(prompt: str, completion: str, answer, **record) -> float   # or async def

``prompt`` is the prompt text before any chat template, ``answer`` the record's
reference answer, ``record`` the record's other fields. The built-ins are small
classes (picklable, so the ``process`` executor can ship them to its workers).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import re
import threading
import traceback
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asyncrl.config.dataset import (
    CustomRewardConfig,
    ExactMatchRewardConfig,
    MathVerifyRewardConfig,
    RegexRewardConfig,
)
from asyncrl.config.targets import load_target
from asyncrl.errors import ConfigError, RewardError, require
from asyncrl.tasks.common import match_reward
from asyncrl.types import Prompt

RewardFunction = Callable[..., "float | Awaitable[float]"]

#: Keyword names the call itself uses: record fields with these names are not passed.
RESERVED = ("prompt", "completion", "answer")


def _answers(answer: Any) -> list[str]:
    """The acceptable reference answers (a list answer means any of them)."""
    if answer is None:
        raise ValueError("the record has no reference answer; set task.answer_key")
    return [str(a) for a in answer] if isinstance(answer, (list, tuple)) else [str(answer)]


class ExactMatch:
    """1.0 when the completion equals a reference answer after normalisation,
    else ``partial_credit`` x (characters in the right place) / (longer length)."""

    def __init__(self, cfg: ExactMatchRewardConfig | None = None) -> None:
        self.cfg = cfg or ExactMatchRewardConfig()

    def normalise(self, text: str) -> str:
        if self.cfg.collapse_whitespace:
            text = re.sub(r"\s+", " ", text)
        if self.cfg.strip:
            text = text.strip()
        return text.casefold() if self.cfg.ignore_case else text

    def __call__(self, prompt: str, completion: str, answer: Any, **record: Any) -> float:
        got = self.normalise(completion)
        return max(match_reward(got, self.normalise(ref), self.cfg.partial_credit, strip=False)
                   for ref in _answers(answer))


class Regex:
    """1.0 when the pattern matches the completion, else 0.0."""

    def __init__(self, cfg: RegexRewardConfig) -> None:
        self.cfg = cfg
        self._pattern = re.compile(cfg.pattern)

    def __call__(self, prompt: str, completion: str, answer: Any, **record: Any) -> float:
        match = self._pattern.fullmatch if self.cfg.full_match else self._pattern.search
        return 1.0 if match(completion) else 0.0


class MathVerify:
    """1.0 when the completion's answer equals the reference mathematically.

    Both sides go through ``math_verify.parse`` (a final ``\\boxed{}``, a LaTeX
    expression, or the last number or expression), then ``math_verify.verify``
    (so ``1/2``, ``0.5`` and ``\\frac{1}{2}`` are equal). math-verify's own
    timeouts use ``signal.alarm``, which only works in the main thread; they are
    off here because the reward pool enforces ``task.reward.timeout_s``.
    """

    def __init__(self, cfg: MathVerifyRewardConfig | None = None) -> None:
        self.cfg = cfg or MathVerifyRewardConfig()

    def __call__(self, prompt: str, completion: str, answer: Any, **record: Any) -> float:
        mv = require("math_verify", "math", "the math_verify reward")
        # It warns once that its own timeout is off; the pool's timeout stands in.
        logging.getLogger("math_verify").setLevel(logging.ERROR)
        golds = [mv.parse(ref, parsing_timeout=None) for ref in _answers(answer)]
        if not any(golds):
            raise ValueError(f"math_verify could not parse the reference answer {answer!r}")
        pred = mv.parse(completion, parsing_timeout=None)
        ok = any(mv.verify(gold, pred, timeout_seconds=None) for gold in golds if gold)
        return 1.0 if ok else 0.0


def load_custom_reward(cfg: CustomRewardConfig, record_fields: Sequence[str] = ()) -> RewardFunction:
    """The function ``cfg.target`` names, checked to take
    ``(prompt, completion, answer, **record)`` with these ``record_fields``."""
    fn = load_target(cfg.target, field="task.reward.target", kind="function",
                     example="my_rewards:score")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no signature: let the call decide
        return fn
    fields = [f for f in record_fields if f not in RESERVED]
    try:
        sig.bind("prompt", "completion", "answer", **dict.fromkeys(fields))
    except TypeError as exc:
        name = getattr(fn, "__name__", "fn")
        raise ConfigError(
            f"task.reward.target {cfg.target!r}: {name}{sig} cannot be called as "
            f"{name}(prompt, completion, answer, **record) with this dataset's other fields "
            f"{fields} ({exc}); define it as def {name}(prompt, completion, answer, **record)"
        ) from None
    return fn


def build_reward_function(cfg: Any, record_fields: Sequence[str] = ()) -> RewardFunction:
    """The reward function a ``task.reward`` block describes."""
    if isinstance(cfg, CustomRewardConfig):
        return load_custom_reward(cfg, record_fields)
    if isinstance(cfg, ExactMatchRewardConfig):
        return ExactMatch(cfg)
    if isinstance(cfg, RegexRewardConfig):
        return Regex(cfg)
    if isinstance(cfg, MathVerifyRewardConfig):
        require("math_verify", "math", "the math_verify reward")
        return MathVerify(cfg)
    raise ConfigError(f"task.reward: no reward function for {type(cfg).__name__}")


class RecordReward:
    """A reward function seen as ``Task.reward``: ``(prompt: Prompt, completion) -> float``.

    The prompt it gets is the one :meth:`DatasetTask.prepare_reward` builds: the
    text before any chat template, the answer, and the record's other fields in
    ``meta["record"]``. Picklable whenever the function is.
    """

    def __init__(self, fn: RewardFunction) -> None:
        self.fn = fn

    def __call__(self, prompt: Prompt, completion: str) -> Any:
        return self.fn(prompt.text, completion, prompt.answer, **prompt.meta.get("record", {}))

    def __repr__(self) -> str:
        return f"RecordReward({describe_function(self.fn)})"


# ------------------------------------------------------------ calling one
def describe_function(fn: Any) -> str:
    inner = getattr(fn, "fn", None)  # RecordReward
    if inner is not None:
        return describe_function(inner)
    module = getattr(fn, "__module__", None) or "?"
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}:{name}"


def describe_exception(exc: BaseException) -> str:
    """``Type: message (at file:line in function)`` of the innermost frame."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        last = frames[-1]
        text += f" (at {last.filename}:{last.lineno} in {last.name})"
    return text


class _WorkerLoop(threading.local):
    loop: asyncio.AbstractEventLoop | None = None


_worker = _WorkerLoop()


def use_worker_loop() -> asyncio.AbstractEventLoop:
    """Give this worker thread (or process) an event loop for async rewards,
    reused for every call it makes; :func:`close_worker_loop` closes it."""
    if _worker.loop is None:
        _worker.loop = asyncio.new_event_loop()
    return _worker.loop


def close_worker_loop() -> None:
    if _worker.loop is not None:
        _worker.loop.close()
        _worker.loop = None


async def _wait(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def resolve(value: Any) -> Any:
    """``value``, or what it resolves to when a reward is ``async def``."""
    if not inspect.isawaitable(value):
        return value
    if _worker.loop is not None:
        return _worker.loop.run_until_complete(_wait(value))
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_wait(value))
    # Called synchronously from inside a running loop (the direct Task.reward
    # path): that loop cannot run the coroutine, a loop in another thread can.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _wait(value)).result()


def _check(reward: Any, value: Any) -> float:
    if isinstance(value, bool):
        return float(value)
    try:
        if isinstance(value, (str, bytes)):  # float("1") would hide text rewards
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise RewardError(
            f"{describe_function(reward)} returned {value!r}, not a number; return a float"
        ) from None
    if not math.isfinite(number):
        raise RewardError(f"{describe_function(reward)} returned {number}; return a finite float")
    return number


def _failed(reward: Any, index: int, exc: BaseException) -> RewardError:
    return RewardError(
        f"completion {index}: {describe_function(reward)} raised {describe_exception(exc)}")


async def _gather(awaitables: list[Awaitable[Any]]) -> list[Any]:
    return await asyncio.gather(*awaitables, return_exceptions=True)


def score_many(
    reward: Callable[[Prompt, str], Any],
    prompt: Prompt,
    completions: Sequence[str],
    mark: Callable[[], None] = lambda: None,
) -> list[float]:
    """Rewards of ``completions``, one call each, in this thread; any failure is a
    :class:`RewardError` naming the completion and carrying the error text.

    A plain function is called for one completion after the other, ``mark()``
    just before each call (the pool's per-call timeout restarts there). An
    ``async def`` reward's calls all start at once and run concurrently.
    """
    values: list[Any] = []
    for index, completion in enumerate(completions):
        mark()
        try:
            values.append(reward(prompt, completion))
        except Exception as exc:
            raise _failed(reward, index, exc) from exc
    waiting = [i for i, v in enumerate(values) if inspect.isawaitable(v)]
    if waiting:
        done = resolve(_gather([values[i] for i in waiting]))
        for i, value in zip(waiting, done):
            if isinstance(value, BaseException):
                raise _failed(reward, i, value) from value
            values[i] = value
    out = []
    for index, value in enumerate(values):
        try:
            out.append(_check(reward, value))
        except RewardError as exc:
            raise RewardError(f"completion {index}: {exc}") from None
    return out
