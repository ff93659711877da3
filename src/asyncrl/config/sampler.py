"""The ``async_rl.sampler`` block: one config per built-in staleness sampler
and ``custom`` (a discriminated union on ``name``); :mod:`asyncrl.sampling.factory`
builds the sampler a block describes."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BaseModel, Field, StrictInt, TypeAdapter, ValidationError

from asyncrl.config.blocks import Block
from asyncrl.config.explain import explain
from asyncrl.config.nemo_rl_keys import RefusesRenamedKeys
from asyncrl.config.targets import TargetBlock
from asyncrl.errors import SamplerConfigError

_Window = Annotated[
    StrictInt, Field(ge=0, description="staleness/lookahead window in versions")
]


class InOrderSamplerConfig(Block, RefusesRenamedKeys):
    nemo_rl_block: ClassVar[str] = "sampler"  # NeMo-RL's PPO warm-up key, refused

    name: Literal["in_order"] = "in_order"
    max_lookahead_versions: _Window = 1


#: Which weight of a group the window bounds (see docs/samplers.md).
_StalenessOf = Literal["start_weight", "end_weight"]


class WeightFifoSamplerConfig(Block):
    name: Literal["weight_fifo"] = "weight_fifo"
    max_staleness_versions: _Window = 1
    staleness_of: _StalenessOf = "start_weight"


class WindowedSamplerConfig(Block):
    name: Literal["windowed"] = "windowed"
    max_staleness_versions: _Window = 1
    sample_freshest_first: bool = False
    staleness_of: _StalenessOf = "start_weight"


class ReadyFirstSamplerConfig(Block):
    name: Literal["ready_first"] = "ready_first"
    max_staleness_versions: _Window = 1


class CustomSamplerConfig(TargetBlock):
    """``target: "module:ClassName"``; every other key goes to the constructor."""

    example: ClassVar[str] = "my_pkg.samplers:MySampler"
    name: Literal["custom"] = "custom"


SamplerConfig = Annotated[
    Union[  # noqa: UP007 - pydantic discriminated unions read clearer this way
        InOrderSamplerConfig,
        WeightFifoSamplerConfig,
        WindowedSamplerConfig,
        ReadyFirstSamplerConfig,
        CustomSamplerConfig,
    ],
    Field(discriminator="name"),
]

_ADAPTER: TypeAdapter[Any] = TypeAdapter(SamplerConfig)

SAMPLER_NAMES = ("in_order", "weight_fifo", "windowed", "ready_first", "custom")

# The window knob's name per built-in policy, for tools that vary it (simulate --compare).
WINDOW_FIELD = {
    "in_order": "max_lookahead_versions",
    "weight_fifo": "max_staleness_versions",
    "windowed": "max_staleness_versions",
    "ready_first": "max_staleness_versions",
}


def parse_sampler_config(cfg: Any, *, path: str = "async_rl.sampler") -> Any:
    """Validate a dict (or pass through a config model) into a SamplerConfig member."""
    if isinstance(cfg, BaseModel):
        return cfg
    if not isinstance(cfg, dict) or "name" not in cfg:
        raise SamplerConfigError(
            f"{path}: expected a mapping with a 'name' key, one of {', '.join(SAMPLER_NAMES)}; "
            f"got {cfg!r}"
        )
    try:
        return _ADAPTER.validate_python(cfg)
    except ValidationError as exc:
        raise SamplerConfigError(explain(exc, SamplerConfig, path)) from None


__all__ = [
    "SAMPLER_NAMES",
    "WINDOW_FIELD",
    "CustomSamplerConfig",
    "InOrderSamplerConfig",
    "ReadyFirstSamplerConfig",
    "SamplerConfig",
    "WeightFifoSamplerConfig",
    "WindowedSamplerConfig",
    "parse_sampler_config",
]
