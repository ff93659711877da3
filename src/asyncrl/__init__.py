"""asyncrl: asynchronous RL for language-model policies with pluggable staleness samplers.

The public API is re-exported here; heavy optional parts (torch models,
transformers, Ray) are imported only when used.
"""

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.config import RunConfig, load_config
from asyncrl.controller import Controller, Ledger, RunResult
from asyncrl.errors import (
    AsyncRLError,
    BackendBug,
    CheckpointError,
    ConfigError,
    GenerationError,
    GenerationTimeout,
    MissingDependency,
    PromptError,
    RewardError,
    RewardTimeout,
    RewardWorkerLost,
    RolloutFailure,
    RolloutStall,
    SamplerConfigError,
    SetupError,
    TokenizationError,
    TooManyFailedGroups,
    failure_kind,
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
    "BackendBug",
    "BaseSampler",
    "CheckpointError",
    "Completion",
    "ConfigError",
    "Controller",
    "GenerationError",
    "GenerationRequest",
    "GenerationTimeout",
    "GroupResult",
    "InOrderSampler",
    "Ledger",
    "MissingDependency",
    "Prompt",
    "PromptError",
    "PromptGroupSampler",
    "ReadyFirstSampler",
    "RewardError",
    "RewardTimeout",
    "RewardWorkerLost",
    "Rollout",
    "RolloutBuffer",
    "RolloutFailure",
    "RolloutStall",
    "RunConfig",
    "RunResult",
    "SamplerConfig",
    "SamplerConfigError",
    "SetupError",
    "Slot",
    "TokenizationError",
    "TooManyFailedGroups",
    "TrainerVersion",
    "WeightFifoSampler",
    "WindowedSampler",
    "__version__",
    "create_sampler",
    "failure_kind",
    "load_config",
]
