"""Config of what happens when rollouts fail or stall, in NeMo-RL's names.

``async_rl.rollout_failure``, ``async_rl.stall_watchdog`` and the two NeMo-RL
blocks asyncrl accepts only switched off (``generation_fleet_health``,
``generation_router``) live here, apart from :mod:`asyncrl.config.schema`, so
that the one place defining NeMo-RL compatibility is small enough to read whole.
docs/training.md lists every key; which NeMo-RL keys are implemented,
accepted only at their off values, or refused (renamed by NeMo-RL, or keys of
an older asyncrl) is the table of :mod:`asyncrl.config.nemo_rl_keys`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from asyncrl.config.blocks import Block, NonNegInt, PosFloat, PosInt
from asyncrl.config.nemo_rl_keys import RefusesRenamedKeys


# ------------------------------------------------------------ rollout failure
class NativeTimeoutsConfig(Block):
    """Deadlines of one attempt (None: none, the default)."""

    #: One generation call of one prompt group; past it the attempt fails as infra.
    generation_timeout_s: PosFloat | None = None
    #: One scoring call of one prompt group (on top of task.reward.timeout_s, which
    #: bounds each reward call); past it the attempt fails as infra.
    env_timeout_s: PosFloat | None = None


class NemoGymConfig(Block):
    """NeMo-RL's NeMo-Gym rollout path, which asyncrl does not have: accepted at
    its defaults only."""

    rollout_timeout_s: None = None
    max_row_attempts: Literal[3] = 3

    @model_validator(mode="before")
    @classmethod
    def _defaults_only(cls, data: Any) -> Any:
        defaults = {"rollout_timeout_s": None, "max_row_attempts": 3}
        if isinstance(data, dict):
            changed = [f"{k}={v!r}" for k, v in data.items() if k in defaults
                       and v != defaults[k]]
            if changed:
                raise ValueError(
                    f"asyncrl has no NeMo-Gym rollout path, so {', '.join(changed)} would do "
                    "nothing; remove the nemo_gym block or leave it at its defaults "
                    "(rollout_timeout_s: null, max_row_attempts: 3)")
        return data


class RolloutFailureConfig(Block, RefusesRenamedKeys):
    """What a failed attempt costs, and what becomes of a prompt that runs out
    of attempts (docs/controller.md, Failures)."""

    nemo_rl_block: ClassVar[str] = "rollout_failure"

    #: Attempts that may fail as infra (engine, worker, transport, deadline); each
    #: retry waits a backoff and goes to another engine when there is one.
    max_infra_attempts_per_prompt: PosInt = 5
    #: Attempts that may fail as data (reward, task, tokenizer); retried at once.
    #: The two budgets are independent counters.
    max_data_attempts_per_prompt: PosInt = 2
    #: First infra-retry delay, doubled per infra failure up to max_backoff_s.
    backoff_base_s: PosFloat = 1.0
    max_backoff_s: PosFloat = 30.0
    #: Prompts that may exhaust their data budget (skipped) before the run fails.
    max_skipped_prompts: NonNegInt = 0
    #: Consecutive prompts that may exhaust their infra budget (dropped) before the
    #: run fails; any commit resets the count.
    max_consecutive_dropped_prompts: NonNegInt = 0
    #: A step trains on at least ceil(fraction * num_prompts_per_step) groups.
    min_step_batch_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 0.9
    #: shrink: the step a dropped prompt was meant for trains on fewer groups.
    #: replace: a fresh prompt takes its place and stamp (then shrink when the
    #: replacement attempts or the spare prompts run out).
    on_dropped_prompt: Literal["shrink", "replace"] = "shrink"
    #: Fresh prompts tried per lost group (replace only).
    max_replacement_attempts: NonNegInt = 1
    #: Low-water mark of the pool of spare prompts replacements come from; the
    #: pool is refilled with one dispatch batch of prompts (replace only).
    replacement_reserve_prompts: NonNegInt = 1
    native: NativeTimeoutsConfig = Field(default_factory=NativeTimeoutsConfig)
    nemo_gym: NemoGymConfig = Field(default_factory=NemoGymConfig)

    @model_validator(mode="after")
    def _consistent(self) -> RolloutFailureConfig:
        if self.max_backoff_s < self.backoff_base_s:
            raise ValueError(
                f"max_backoff_s={self.max_backoff_s:g} is below backoff_base_s="
                f"{self.backoff_base_s:g}, so the cap would silently replace the base: raise "
                "max_backoff_s or lower backoff_base_s")
        if self.on_dropped_prompt == "replace":
            for key in ("max_replacement_attempts", "replacement_reserve_prompts"):
                if getattr(self, key) < 1:
                    raise ValueError(
                        f"on_dropped_prompt: replace needs {key} >= 1; at 0 no replacement "
                        "is ever made, which is on_dropped_prompt: shrink")
        return self

    def step_floor(self, num_prompts_per_step: int) -> int:
        """The fewest groups a step may train on."""
        # A hair under the product keeps 0.9 * 10 from rounding up to 10 (9.000000000000002).
        return max(1, math.ceil(self.min_step_batch_fraction * num_prompts_per_step - 1e-9))

    def backoff(self, infra_failures: int) -> float:
        """Wait before the next attempt after the ``infra_failures``-th infra failure."""
        return min(self.backoff_base_s * 2 ** (infra_failures - 1), self.max_backoff_s)


# --------------------------------------------------------------- watchdog
class StallWatchdogConfig(Block):
    """Last-resort stall detection (``async_rl.stall_watchdog: null`` turns it off;
    ``asyncrl simulate`` always runs without it)."""

    #: How often the watchdog looks.
    interval_s: PosFloat = 30.0
    #: No group committed and no step finished for this long is a stall.
    stall_timeout_s: PosFloat = 600.0
    #: warn: one line per interval naming the side that stalled, the run goes on.
    #: abort: a graceful stop (checkpoint, summary, resume command); a trainer that
    #: does not answer cannot be checkpointed, so a trainer-side stall fails the run.
    stall_action: Literal["warn", "abort"] = "warn"
    #: NeMo-Gym's subprocess check; asyncrl has no NeMo-Gym servers: no effect.
    gym_subprocess_check: bool = True

    @model_validator(mode="after")
    def _timeout_exceeds_interval(self) -> StallWatchdogConfig:
        if self.stall_timeout_s <= self.interval_s:
            raise ValueError(
                f"stall_timeout_s={self.stall_timeout_s:g} must be above interval_s="
                f"{self.interval_s:g}, or a stall is reported before the watchdog could see one")
        return self


# ---------------------------------------------- NeMo-RL blocks accepted off
class _OffOnly(Block):
    """A NeMo-RL block asyncrl cannot honour yet: accepted with ``enabled: false``
    (its other keys then do nothing, in NeMo-RL too), refused with one line otherwise.
    Other keys are kept as written, so a block pasted from any NeMo-RL version loads."""

    model_config = ConfigDict(extra="allow")
    why: ClassVar[str] = ""

    enabled: Literal[False] = False

    @model_validator(mode="before")
    @classmethod
    def _off(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("enabled", False) is not False:
            raise ValueError(f"enabled: {str(data['enabled']).lower()} is not supported: "
                             f"{cls.why}; set enabled: false or remove the block")
        return data


class GenerationFleetHealthConfig(_OffOnly):
    why = ("asyncrl does not probe the health of a generation fleet yet (the Ray backend "
            "restarts dead workers on its own, cluster.max_worker_restarts)")


class GenerationRouterConfig(_OffOnly):
    why = "the generation router serves NeMo-Gym, which asyncrl does not run"


__all__ = [
    "GenerationFleetHealthConfig",
    "GenerationRouterConfig",
    "NativeTimeoutsConfig",
    "NemoGymConfig",
    "RefusesRenamedKeys",
    "RolloutFailureConfig",
    "StallWatchdogConfig",
]
