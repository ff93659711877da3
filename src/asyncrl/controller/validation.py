"""Setup validation: refuse configs that could deadlock, reading derived facts only."""

from __future__ import annotations

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.errors import SetupError
from asyncrl.sampling import PromptGroupSampler


def derived_facts(sampler: PromptGroupSampler, grpo: GRPOConfig) -> dict[str, object]:
    """What the sampler implies for this setup (printed by ``asyncrl validate``)."""
    max_staleness = getattr(sampler, "max_staleness", None)
    return {
        "sampler": type(sampler).__name__,
        "is_on_policy": bool(sampler.is_on_policy),
        "required_buffer_capacity": sampler.required_buffer_capacity(grpo.num_prompts_per_step),
        "max_staleness": max_staleness() if callable(max_staleness) else None,
    }


def validate_setup(sampler: PromptGroupSampler, grpo: GRPOConfig, cfg: AsyncRLConfig) -> None:
    """Raise :class:`SetupError` for a setup the pumps could deadlock on."""
    cap = cfg.max_buffered_rollouts
    n = grpo.num_prompts_per_step
    name = type(sampler).__name__
    required = sampler.required_buffer_capacity(n)
    if required is not None and cap < required:
        raise SetupError(
            f"async_rl.max_buffered_rollouts={cap} is below the {required} slots {name} needs "
            f"for num_prompts_per_step={n} (every batch it may admit ahead must fit, or the "
            f"rollout pump and the train pump wait on each other forever). Set "
            f"async_rl.max_buffered_rollouts >= {required}, or lower the sampler's window"
        )
    if cap < cfg.min_groups_for_streaming_train:
        raise SetupError(
            f"async_rl.max_buffered_rollouts={cap} is below "
            f"async_rl.min_groups_for_streaming_train={cfg.min_groups_for_streaming_train}: the "
            f"trainer would wait for more ready groups than the buffer can hold. Set "
            f"max_buffered_rollouts >= {cfg.min_groups_for_streaming_train} or lower "
            f"min_groups_for_streaming_train"
        )
