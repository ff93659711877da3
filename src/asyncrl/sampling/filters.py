"""Group filters of ``grpo.dynamic_sampling``: which finished groups carry no
training signal.

A filter runs at *commit*, where a group's rewards become known, never inside a
sampler's ``select``: a filtered group then never holds one of the buffer's
slots (the capacity that bounds run-ahead) and ``select`` never waits for its
replacement. The controller records it ``filtered`` in the ledger with the
reason the filter gave, and replaces it when its dispatch batch can no longer
yield ``num_prompts_per_step`` kept groups (docs/recipes.md, "Dynamic sampling").
"""

from __future__ import annotations

import inspect
from typing import Protocol, runtime_checkable

from asyncrl.config.dynamic_sampling import DynamicSamplingConfig
from asyncrl.config.targets import load_target
from asyncrl.errors import ConfigError
from asyncrl.types import Rollout

FIELD = "grpo.dynamic_sampling.filter"


@runtime_checkable
class GroupFilter(Protocol):
    """Decides, for each finished group, whether it is trained.

    Construction: ``Filter()`` with no arguments (``filter: "module:ClassName"``).
    """

    def reject(self, rollout: Rollout) -> str | None:
        """Called by the controller once per group whose generation and scoring
        succeeded, with its rewards, before it is committed to the buffer (in
        dispatch order in deterministic mode). Returns None to keep the group, or
        a short reason to filter it (recorded in the ledger and counted by
        reason, so keep the number of distinct reasons small). Runs on the event
        loop: it must be cheap and must not block; an exception stops the run."""
        ...


class ZeroVarianceFilter:
    """DAPO's filter: a group whose rewards are all equal (within ``tolerance``)
    has zero advantage for every completion and teaches nothing."""

    def __init__(self, tolerance: float = 1e-6) -> None:
        self.tolerance = tolerance

    def reject(self, rollout: Rollout) -> str | None:
        rewards = rollout.rewards
        low, high = min(rewards), max(rewards)
        if high - low > self.tolerance:
            return None
        return f"zero_variance: every reward {low:.3g}"


def build_filter(cfg: DynamicSamplingConfig) -> GroupFilter | None:
    """The filter ``cfg`` names, or None for ``none`` (then nothing is checked at
    commit: the hot path pays one attribute test per group)."""
    if cfg.filter == "none":
        return None
    if cfg.filter == "zero_variance":
        return ZeroVarianceFilter(cfg.reward_tolerance)
    cls = load_target(cfg.filter, field=FIELD, kind="class",
                      example="my_pkg.filters:MyFilter")
    try:
        made = cls()
    except Exception as exc:
        raise ConfigError(
            f"{FIELD} {cfg.filter!r} could not be constructed: {cls.__name__}() raised "
            f"{type(exc).__name__}: {exc}. A filter is built with no arguments; give every "
            "parameter of its __init__ a default") from exc
    if not isinstance(made, GroupFilter) or inspect.iscoroutinefunction(made.reject):
        raise ConfigError(
            f"{FIELD} {cfg.filter!r} does not satisfy asyncrl.sampling.GroupFilter: define "
            "a plain (not async) method reject(self, rollout) -> str | None")
    return made


__all__ = ["GroupFilter", "ZeroVarianceFilter", "build_filter"]
