"""Setup validation: refuse configs that could deadlock, reading derived facts only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.errors import SetupError
from asyncrl.sampling import OverSamplingSampler, PromptGroupSampler


def groups_per_batch(sampler: PromptGroupSampler, grpo: GRPOConfig) -> int:
    """Prompts one admitted dispatch batch holds: ``num_prompts_per_step``, or
    more when the sampler over-samples (:class:`~asyncrl.sampling.OverSamplingSampler`)."""
    n = grpo.num_prompts_per_step
    return sampler.groups_per_batch(n) if isinstance(sampler, OverSamplingSampler) else n


def set_up_over_sampling(sampler: PromptGroupSampler, grpo: GRPOConfig) -> None:
    """Hand ``grpo.dynamic_sampling.batch_multiplier`` to the sampler, which owns
    over-sampling; refuse a sampler that cannot account for it."""
    multiplier = grpo.dynamic_sampling.batch_multiplier
    if isinstance(sampler, OverSamplingSampler):
        sampler.set_batch_multiplier(multiplier)
    elif multiplier != 1.0:
        raise SetupError(
            f"grpo.dynamic_sampling.batch_multiplier={multiplier:g} needs a sampler that "
            f"accounts for over-sampling (asyncrl.sampling.OverSamplingSampler); "
            f"{type(sampler).__name__} does not. Subclass asyncrl.sampling.BaseSampler, or set "
            "batch_multiplier: 1.0")


def dynamic_sampling_facts(sampler: PromptGroupSampler, grpo: GRPOConfig) -> dict[str, object]:
    """What ``grpo.dynamic_sampling`` implies (printed by ``asyncrl validate``)."""
    ds = grpo.dynamic_sampling
    k = groups_per_batch(sampler, grpo)
    over = isinstance(sampler, OverSamplingSampler) and k > grpo.num_prompts_per_step
    return {
        "filter": ds.filter,
        "groups_per_batch": k,
        "max_groups_generated_per_batch": ds.max_gen_batches * k if ds.enabled else k,
        "surplus": sampler.surplus if over else None,  # type: ignore[attr-defined]
    }


def derived_facts(sampler: PromptGroupSampler, grpo: GRPOConfig) -> dict[str, object]:
    """What the sampler implies for this setup (printed by ``asyncrl validate``)."""
    max_staleness = getattr(sampler, "max_staleness", None)
    bound = max_staleness() if callable(max_staleness) else None
    max_end = getattr(sampler, "max_end_staleness", None)
    return {
        **dynamic_sampling_facts(sampler, grpo),
        "sampler": type(sampler).__name__,
        "is_on_policy": bool(sampler.is_on_policy),
        "required_buffer_capacity": sampler.required_buffer_capacity(grpo.num_prompts_per_step),
        "max_staleness": bound,
        "staleness_measure": staleness_measure(sampler),
        "max_end_staleness": max_end() if callable(max_end) else bound,
    }


def staleness_measure(sampler: PromptGroupSampler) -> str:
    """The sampler's optional ``staleness_measure`` fact (``start_weight`` when it has none)."""
    return str(getattr(sampler, "staleness_measure", "start_weight"))


def pinned_weight_version(sampler: PromptGroupSampler, dispatch_index: int) -> int | None:
    """The sampler's optional ``pinned_weight_version`` fact (None when it has none)."""
    fact = getattr(sampler, "pinned_weight_version", None)
    return fact(dispatch_index) if callable(fact) else None


def _fact(sampler: PromptGroupSampler, name: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:
        raise SetupError(
            f"sampler {type(sampler).__name__} (async_rl.sampler): its derived fact {name} "
            f"raised {type(exc).__name__}: {exc}; fix the sampler"
        ) from exc


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_derived_facts(sampler: PromptGroupSampler, grpo: GRPOConfig) -> None:
    """Refuse a sampler whose derived facts make no sense (a custom one, usually):
    every consumer trusts them, so a negative capacity or a non-bool
    ``is_on_policy`` would turn into a deadlock or a wrong cache decision later."""
    name = type(sampler).__name__
    n = grpo.num_prompts_per_step
    problems = []
    on_policy = _fact(sampler, "is_on_policy", lambda: sampler.is_on_policy)
    if not isinstance(on_policy, bool):
        problems.append(f"is_on_policy is {on_policy!r}, not True or False")
    required = _fact(sampler, "required_buffer_capacity",
                     lambda: sampler.required_buffer_capacity(n))
    if required is not None and not _is_count(required):
        problems.append(f"required_buffer_capacity({n}) is {required!r}, not None or a "
                        "non-negative int")
    measure = _fact(sampler, "staleness_measure", lambda: staleness_measure(sampler))
    if measure not in ("start_weight", "end_weight"):
        problems.append(f"staleness_measure is {measure!r}, not 'start_weight' or 'end_weight'")
    for fact, arg in (("max_staleness", ()), ("max_end_staleness", ()),
                      ("pinned_weight_version", (0,))):
        fn = getattr(sampler, fact, None)
        if callable(fn):
            value = _fact(sampler, fact, lambda fn=fn, arg=arg: fn(*arg))
            if value is not None and not _is_count(value):
                problems.append(f"{fact}({', '.join(map(str, arg))}) is {value!r}, not None "
                                "or a non-negative int")
    if problems:
        raise SetupError(
            f"sampler {name} (async_rl.sampler) reports impossible derived facts: "
            + "; ".join(problems)
            + ". Check its window or other settings (a negative window?) and the code that "
            "computes these facts (see docs/samplers.md)"
        )


def validate_setup(
    sampler: PromptGroupSampler,
    grpo: GRPOConfig,
    cfg: AsyncRLConfig,
    *,
    deterministic: bool = False,
) -> None:
    """Raise :class:`SetupError` for a setup the pumps could deadlock on, or
    (with ``deterministic``) one whose generation weights depend on timing, or
    one whose derived facts are impossible (:func:`check_derived_facts`).
    First hands the over-sampling to the sampler (:func:`set_up_over_sampling`):
    the facts checked include it."""
    set_up_over_sampling(sampler, grpo)
    check_derived_facts(sampler, grpo)
    name = type(sampler).__name__
    if deterministic and pinned_weight_version(sampler, 0) is None:
        raise SetupError(
            f"deterministic: true needs a sampler that pins the weight version of each "
            f"dispatch batch (its pinned_weight_version fact); {name} reports none, so which "
            "weights generate a batch would depend on timing. Use in_order, weight_fifo or "
            "ready_first (or a custom sampler that reports pinned_weight_version), or set "
            "deterministic: false"
        )
    if deterministic and staleness_measure(sampler) == "end_weight":
        raise SetupError(
            f"deterministic: true with {name} measuring staleness by end_weight: which groups a "
            "step trains would depend on when groups in flight finish. A deterministic run "
            "generates each group with one pinned version, so end_weight equals start_weight "
            "anyway: set async_rl.sampler.staleness_of: start_weight, or deterministic: false"
        )
    if deterministic and grpo.dynamic_sampling.enabled:
        raise SetupError(
            f"deterministic: true with grpo.dynamic_sampling.filter: {grpo.dynamic_sampling.filter}"
            ": the filter is a function of the rewards, but a filtered group's replacement "
            "prompt, its group id (its seed) and its place in the commit order depend on when "
            "the filter ran relative to the admission of later batches, so the run would depend "
            "on timing. Set grpo.dynamic_sampling.filter: none, or deterministic: false")
    ds = grpo.dynamic_sampling
    if ds.filter == "zero_variance" and grpo.num_generations_per_prompt < 2:
        raise SetupError(
            "grpo.dynamic_sampling.filter: zero_variance with grpo.num_generations_per_prompt=1: "
            "a group of one completion never has reward variance, so every group would be "
            "filtered. Set num_generations_per_prompt >= 2, or filter: none")
    if deterministic and cfg.autopilot.enabled:
        raise SetupError(
            "deterministic: true with async_rl.autopilot.enabled: the autopilot decides from "
            "measured timings, so the run would depend on them. Set async_rl.autopilot.enabled: "
            "false, or deterministic: false")
    cap = cfg.max_buffered_rollouts
    n = grpo.num_prompts_per_step
    required = sampler.required_buffer_capacity(n)
    if required is not None and cap < required:
        raise SetupError(
            f"async_rl.max_buffered_rollouts={cap} is below the {required} slots {name} needs "
            f"for num_prompts_per_step={n}{_over(sampler, grpo)} (every batch it may admit "
            "ahead must fit, or the "
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


def _over(sampler: PromptGroupSampler, grpo: GRPOConfig) -> str:
    k = groups_per_batch(sampler, grpo)
    if k == grpo.num_prompts_per_step:
        return ""
    return (f" over-sampled to {k} groups per batch (grpo.dynamic_sampling.batch_multiplier="
            f"{grpo.dynamic_sampling.batch_multiplier:g})")


def failure_warnings(grpo: GRPOConfig, cfg: AsyncRLConfig) -> list[str]:
    """``rollout_failure`` settings that cannot do what they were set for (each a
    coherent thing to type, so a warning, not an error; printed by ``asyncrl
    validate`` and logged when a run starts)."""
    rf = cfg.rollout_failure
    n = grpo.num_prompts_per_step
    floor = rf.step_floor(n)
    out = []
    drops = rf.max_skipped_prompts + rf.max_consecutive_dropped_prompts
    if drops and floor >= n and rf.on_dropped_prompt == "shrink":
        out.append(
            f"async_rl.rollout_failure.min_step_batch_fraction={rf.min_step_batch_fraction:g} "
            f"makes the floor of a step {floor} of num_prompts_per_step={n}, so no step may "
            f"shrink, but max_skipped_prompts={rf.max_skipped_prompts} / "
            f"max_consecutive_dropped_prompts={rf.max_consecutive_dropped_prompts} allow "
            "drops: the first drop stops the run anyway. Lower min_step_batch_fraction, or "
            "set on_dropped_prompt: replace")
    ds = grpo.dynamic_sampling
    if ds.enabled and ds.max_gen_batches == 1 and ds.batch_multiplier == 1.0:
        out.append(
            "grpo.dynamic_sampling.max_gen_batches=1 with batch_multiplier=1.0 leaves the "
            "filter no room: the first group it filters stops the run. Raise max_gen_batches "
            "(replacements) or batch_multiplier (over-sampling)")
    if (cfg.stall_watchdog is not None and cfg.stall_watchdog.stall_action == "abort"
            and cfg.stall_watchdog.stall_timeout_s < 60):
        out.append(
            f"async_rl.stall_watchdog.stall_timeout_s={cfg.stall_watchdog.stall_timeout_s:g} "
            "with stall_action: abort stops the run whenever nothing commits for that long, "
            "model loading and warm-up included")
    return out
