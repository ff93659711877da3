"""asyncrl: asynchronous RL for language-model policies with pluggable staleness samplers.

The public face (docs/design.md, "The public face")::

    import asyncrl

    summary = asyncrl.train("examples/quickstart.yaml", grpo__max_num_steps=20)

* the two ways to train: :func:`train` (``asyncrl train`` from Python) and
  :func:`build_controller` (an ``async with`` around the controller);
* the config: :class:`RunConfig`, :func:`load_config`;
* the protocols a user implements: :class:`Task` (with its :class:`PromptSource`
  and reward, :data:`RewardFunction` for a ``module:function`` reward),
  :class:`RolloutEngine`, :class:`Trainer`, :class:`MetricsSink`, and the
  staleness sampler's :class:`PromptGroupSampler` (:class:`BaseSampler`);
* the values they pass: :class:`Prompt`, :class:`GenerationRequest`,
  :class:`GroupResult`, :class:`Completion`, :class:`Rollout`;
* the errors a caller catches or a component raises to classify a failure
  (the others: :mod:`asyncrl.errors`).

``import asyncrl`` imports neither torch nor transformers, Ray or vLLM:
``train`` and ``build_controller`` (which build models) are imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.config import RunConfig, load_config
from asyncrl.controller import Controller, RunResult
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import (
    AsyncRLError,
    BackendBug,
    CheckpointError,
    ConfigError,
    GenerationError,
    PromptError,
    RewardError,
    RolloutFailure,
    RolloutStall,
    SetupError,
    TooManyFailedGroups,
)
from asyncrl.metrics import MetricsSink
from asyncrl.sampling import BaseSampler, PromptGroupSampler, SamplerConfig, create_sampler
from asyncrl.tasks.base import PromptSource, Task
from asyncrl.tasks.rewards.functions import RewardFunction
from asyncrl.trainers.base import Trainer
from asyncrl.types import Completion, GenerationRequest, GroupResult, Prompt, Rollout
from asyncrl.version import TrainerVersion

if TYPE_CHECKING:
    from asyncrl.run.assemble import build_controller, train

__version__ = "0.1.0"

#: Names imported on first use: they build models (torch, transformers).
_LAZY = {"train": "asyncrl.run.assemble", "build_controller": "asyncrl.run.assemble"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'asyncrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
    "GroupResult",
    "MetricsSink",
    "Prompt",
    "PromptError",
    "PromptGroupSampler",
    "PromptSource",
    "RewardError",
    "RewardFunction",
    "Rollout",
    "RolloutBuffer",
    "RolloutEngine",
    "RolloutFailure",
    "RolloutStall",
    "RunConfig",
    "RunResult",
    "SamplerConfig",
    "SetupError",
    "Slot",
    "Task",
    "TooManyFailedGroups",
    "Trainer",
    "TrainerVersion",
    "__version__",
    "build_controller",
    "create_sampler",
    "load_config",
    "train",
]
