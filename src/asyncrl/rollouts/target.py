"""Load and check the rollout function ``task.rollout`` names.

Checked like a custom sampler or reward (:mod:`asyncrl.config.targets`): by
``asyncrl validate`` and before ``asyncrl train`` builds anything, each failure
a one-line :class:`~asyncrl.errors.ConfigError` naming the target and the fix.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING

from asyncrl.config.targets import load_target
from asyncrl.errors import ConfigError
from asyncrl.rollouts.engine import RolloutFunction, with_rollout_function

if TYPE_CHECKING:
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.tasks.tokenizer import Tokenizer

FIELD = "task.rollout"


def load_rollout(target: str) -> RolloutFunction:
    """The ``async def fn(prompt, session)`` that ``target`` names."""
    fn = load_target(target, field=FIELD, kind="function", example='"tool_use:calculator"')
    name = getattr(fn, "__name__", "rollout")
    if not inspect.iscoroutinefunction(fn):
        raise ConfigError(
            f"{FIELD} {target!r} is not an async function; define it as "
            f"async def {name}(prompt, session) -> RolloutOutput")
    try:
        inspect.signature(fn).bind("prompt", "session")
    except TypeError as exc:
        raise ConfigError(
            f"{FIELD} {target!r}: {name}{inspect.signature(fn)} cannot be called as "
            f"{name}(prompt, session) ({exc}); define it as "
            f"async def {name}(prompt, session) -> RolloutOutput") from None
    return fn


def describe(target: str | None) -> str:
    """What ``asyncrl validate`` shows for ``task.rollout``."""
    return "single-turn (built-in)" if target is None else f"{target} (task.rollout)"


def apply_rollout(target: str, engines: Sequence[RolloutEngine],
                  tokenizer: Tokenizer) -> list[RolloutEngine]:
    """A run's engines with ``task.rollout`` set: each wrapped to run the
    function (:class:`~asyncrl.rollouts.RolloutFunctionEngine`)."""

    return with_rollout_function(engines, load_rollout(target), tokenizer, name=target)


__all__ = ["apply_rollout", "describe", "load_rollout"]
