"""The run configuration: the YAML file's blocks as frozen pydantic models, and
how a file, a dict or overrides become a :class:`RunConfig`.

A leaf of the package: it imports no component (no sampler, buffer, engine or
trainer), so a config loads, validates and explains itself without them. Where
each block lives:

* ``schema`` - :class:`RunConfig`, the root, and the blocks in the file's order:
  ``grpo``, ``async_rl``, the built-in ``task`` blocks, ``loss``, ``trainer``,
  ``cluster``, ``logging``, ``eval``;
* ``checkpoint`` - ``checkpoint``, and NeMo-RL's ``checkpointing`` read into it;
* ``sampler`` - ``async_rl.sampler``; ``failures`` - ``async_rl.rollout_failure``,
  ``async_rl.stall_watchdog`` and the NeMo-RL blocks accepted off, beside
  ``nemo_rl_keys`` (which NeMo-RL key does what here);
* ``dataset`` - ``task: {name: dataset}`` and its reward;
* ``dynamic_sampling`` - ``grpo.dynamic_sampling``;
* ``policy`` - ``policy`` (model, generation, optimizer, ``vllm``, LoRA);
  ``vllm_server`` - ``policy.vllm_server``;
* ``simulate`` - ``simulate``; ``autopilot`` - ``async_rl.autopilot``;
* ``blocks`` - the one base class of every block, and the number types;
  ``targets`` - blocks that name a ``module:ClassName``.

Loading: ``load`` (files, overrides, then ``interpolation`` of ``${a.b}``),
``strict_yaml`` (the YAML reader), ``explain`` (a validation error as one line
per field, with the fix).
"""

from asyncrl.config.autopilot import AutopilotBounds, AutopilotConfig
from asyncrl.config.checkpoint import CheckpointConfig, KeepBest
from asyncrl.config.load import (
    EMPTY_FILE_HINT,
    ConfigSource,
    apply_overrides,
    config_from_dict,
    dump_config,
    load_config,
    parse_override,
    resolve_config,
    set_overrides,
    suggest_key,
)
from asyncrl.config.policy import (
    CustomEngineConfig,
    EngineName,
    GenerationConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    PolicyConfig,
    VLLMConfig,
)
from asyncrl.config.schema import (
    ActorResources,
    ArithmeticTaskConfig,
    AsyncRLConfig,
    ClusterConfig,
    EvalConfig,
    GRPOConfig,
    LoggingConfig,
    LossConfig,
    PartialCredit,
    ReverseTaskConfig,
    RunConfig,
    SortTaskConfig,
    TaskConfig,
    TrainerConfig,
    WandbConfig,
)
from asyncrl.config.simulate import (
    BimodalLatency,
    ConstantLatency,
    EmpiricalLatency,
    LatencyConfig,
    LognormalLatency,
    LognormalParams,
    SimulateConfig,
    TokenLatency,
)

__all__ = [
    "EMPTY_FILE_HINT",
    "ActorResources",
    "ArithmeticTaskConfig",
    "AsyncRLConfig",
    "AutopilotBounds",
    "AutopilotConfig",
    "BimodalLatency",
    "CheckpointConfig",
    "ClusterConfig",
    "ConfigSource",
    "ConstantLatency",
    "CustomEngineConfig",
    "EmpiricalLatency",
    "EngineName",
    "EvalConfig",
    "GRPOConfig",
    "GenerationConfig",
    "KeepBest",
    "LatencyConfig",
    "LoggingConfig",
    "LognormalLatency",
    "LognormalParams",
    "LoraConfig",
    "LossConfig",
    "ModelConfig",
    "OptimizerConfig",
    "PartialCredit",
    "PolicyConfig",
    "ReverseTaskConfig",
    "RunConfig",
    "SimulateConfig",
    "SortTaskConfig",
    "TaskConfig",
    "TokenLatency",
    "TrainerConfig",
    "VLLMConfig",
    "WandbConfig",
    "apply_overrides",
    "config_from_dict",
    "dump_config",
    "load_config",
    "parse_override",
    "resolve_config",
    "set_overrides",
    "suggest_key",
]
