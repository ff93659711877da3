"""asyncrl: asynchronous RL for language-model policies with pluggable staleness samplers.

The public API is re-exported here; heavy optional parts (torch models,
transformers, Ray) are imported only when used.
"""

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.config import RunConfig, load_config
from asyncrl.controller import Controller, Ledger, RunResult
from asyncrl.errors import (
    AsyncRLError,
    CheckpointError,
    ConfigError,
    MissingDependency,
    RolloutStall,
    SamplerConfigError,
    SetupError,
    TooManyFailedGroups,
)
from asyncrl.sampling import (
    BaseSampler,
    InOrderSampler,
    PromptGroupSampler,
    ReadyFirstSampler,
    SamplerConfig,
    WeightFifoSampler,
    WindowedSampler,
    create_sampler,
)
from asyncrl.types import Completion, GenerationRequest, GroupResult, Prompt, Rollout
from asyncrl.version import TrainerVersion

__version__ = "0.1.0"

__all__ = [
    "AsyncRLError",
    "BaseSampler",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "Controller",
    "GenerationRequest",
    "GroupResult",
    "InOrderSampler",
    "Ledger",
    "MissingDependency",
    "Prompt",
    "PromptGroupSampler",
    "ReadyFirstSampler",
    "Rollout",
    "RolloutBuffer",
    "RolloutStall",
    "RunConfig",
    "RunResult",
    "SamplerConfig",
    "SamplerConfigError",
    "SetupError",
    "Slot",
    "TooManyFailedGroups",
    "TrainerVersion",
    "WeightFifoSampler",
    "WindowedSampler",
    "__version__",
    "create_sampler",
    "load_config",
]
