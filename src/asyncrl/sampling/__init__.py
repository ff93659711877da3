"""Staleness samplers: the pluggable contract between the two pumps (``base``),
the built-in policies (``policies``) and the factory that builds one from its
config (``factory``; the configs are :mod:`asyncrl.config.sampler`'s, re-exported
here)."""

from asyncrl.config.sampler import (
    SAMPLER_NAMES,
    WINDOW_FIELD,
    CustomSamplerConfig,
    InOrderSamplerConfig,
    ReadyFirstSamplerConfig,
    SamplerConfig,
    WeightFifoSamplerConfig,
    WindowedSamplerConfig,
    parse_sampler_config,
)
from asyncrl.errors import SamplerConfigError
from asyncrl.sampling.base import (
    BaseSampler,
    OverSamplingSampler,
    PromptGroupSampler,
    RetunableSampler,
)
from asyncrl.sampling.factory import create_sampler, missing_protocol_members
from asyncrl.sampling.filters import GroupFilter, ZeroVarianceFilter, build_filter
from asyncrl.sampling.policies import (
    InOrderSampler,
    ReadyFirstSampler,
    WeightFifoSampler,
    WindowedSampler,
)

__all__ = [
    "SAMPLER_NAMES",
    "WINDOW_FIELD",
    "BaseSampler",
    "CustomSamplerConfig",
    "GroupFilter",
    "InOrderSampler",
    "InOrderSamplerConfig",
    "OverSamplingSampler",
    "PromptGroupSampler",
    "ReadyFirstSampler",
    "ReadyFirstSamplerConfig",
    "RetunableSampler",
    "SamplerConfig",
    "SamplerConfigError",
    "WeightFifoSampler",
    "WeightFifoSamplerConfig",
    "WindowedSampler",
    "WindowedSamplerConfig",
    "ZeroVarianceFilter",
    "build_filter",
    "create_sampler",
    "missing_protocol_members",
    "parse_sampler_config",
]
