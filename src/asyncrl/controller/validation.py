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


def pinned_weight_version(sampler: PromptGroupSampler, dispatch_index: int) -> int | None:
    """The sampler's optional ``pinned_weight_version`` fact (None when it has none)."""
    fact = getattr(sampler, "pinned_weight_version", None)
    return fact(dispatch_index) if callable(fact) else None


def validate_setup(
    sampler: PromptGroupSampler,
    grpo: GRPOConfig,
    cfg: AsyncRLConfig,
    *,
    deterministic: bool = False,
) -> None:
    """Raise :class:`SetupError` for a setup the pumps could deadlock on, or
    (with ``deterministic``) one whose generation weights depend on timing."""
    name = type(sampler).__name__
    if deterministic and pinned_weight_version(sampler, 0) is None:
        raise SetupError(
            f"deterministic: true needs a sampler that pins the weight version of each "
            f"dispatch batch (its pinned_weight_version fact); {name} reports none, so which "
            "weights generate a batch would depend on timing. Use in_order, weight_fifo or "
            "ready_first (or a custom sampler that reports pinned_weight_version), or set "
            "deterministic: false"
        )
    cap = cfg.max_buffered_rollouts
    n = grpo.num_prompts_per_step
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
