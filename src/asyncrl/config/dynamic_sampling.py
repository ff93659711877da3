"""``grpo.dynamic_sampling``: DAPO's dynamic sampling inside the staleness
contract (docs/recipes.md). A group whose rewards carry no signal is filtered
when it is committed, and over-sampling (``batch_multiplier``) admits extra
groups up front so that a step rarely waits for replacements."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictFloat, field_validator

from asyncrl.config.blocks import Block, NonNegFloat, PosInt, split_target

#: The built-in filters; anything else must be a ``module:ClassName`` target.
BUILTIN_FILTERS = ("none", "zero_variance")


class DynamicSamplingConfig(Block):
    #: ``none`` (every finished group is trained), ``zero_variance`` (a group whose
    #: rewards are all equal within ``reward_tolerance`` is filtered at commit), or
    #: ``"module:ClassName"``, a custom filter (``asyncrl.sampling.GroupFilter``,
    #: built with no arguments). Not with ``deterministic: true``.
    filter: str = "none"
    #: Rewards closer than this count as equal for ``zero_variance``.
    reward_tolerance: NonNegFloat = 1e-6
    #: Groups admitted per dispatch batch, ``ceil(batch_multiplier *
    #: num_prompts_per_step)`` (NeMo-RL's ``grpo.batch_multiplier``); the sampler
    #: accounts for the extra in its required capacity and decides what becomes of
    #: kept groups beyond a step's need (``asyncrl validate`` prints both).
    batch_multiplier: Annotated[StrictFloat, Field(ge=1.0)] = 1.0
    #: The filter's own budget (NeMo-RL's ``grpo.dynamic_sampling_max_gen_batches``).
    #: "Per step" in the async runtime is per dispatch batch (each feeds one step;
    #: under ``in_order`` batch ``d`` is step ``d``): a batch and the replacements of
    #: its filtered groups generate at most ``max_gen_batches`` batches' worth of
    #: groups; the replacement past that stops the run with
    #: ``DynamicSamplingBudgetExceeded`` naming this key.
    max_gen_batches: PosInt = 10

    @field_validator("filter")
    @classmethod
    def _known_or_target(cls, value: str) -> str:
        if value in BUILTIN_FILTERS or split_target(value) is not None:
            return value
        raise ValueError(
            f"{value!r} is neither a built-in filter ({', '.join(BUILTIN_FILTERS)}) nor "
            "of the form 'module:ClassName'; write e.g. filter: zero_variance")

    @property
    def enabled(self) -> bool:
        return self.filter != "none"


__all__ = ["BUILTIN_FILTERS", "DynamicSamplingConfig"]
