"""Rollout engines: the protocol and its optional capabilities, the one factory
from ``policy.engine`` to an engine, the weight-transport seam, and the built-in
in-process and vLLM engines.

``LocalEngine`` and ``VLLMEngine`` are imported on first use, so that importing
the protocol does not import torch (nor vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import (
    Aborts,
    EngineCapabilities,
    EnginePressure,
    InvalidatesCache,
    PinsVersions,
    ReportsHealth,
    ReportsPressure,
    RetainsWeights,
    Snapshots,
    WeightsOnDevice,
)
from asyncrl.engines.factory import build_engine
from asyncrl.engines.options import EngineContext, EngineOptions
from asyncrl.engines.transport import InProcessTransport, WeightTransport, WeightUpdate

if TYPE_CHECKING:
    from asyncrl.engines.local.engine import LocalEngine, sampling_logprobs
    from asyncrl.engines.vllm.inprocess import VLLMEngine

__all__ = [
    "Aborts",
    "EngineCapabilities",
    "EngineContext",
    "EngineOptions",
    "EnginePressure",
    "InProcessTransport",
    "InvalidatesCache",
    "LocalEngine",
    "PinsVersions",
    "ReportsHealth",
    "ReportsPressure",
    "RetainsWeights",
    "RolloutEngine",
    "Snapshots",
    "VLLMEngine",
    "WeightTransport",
    "WeightUpdate",
    "WeightsOnDevice",
    "build_engine",
    "sampling_logprobs",
]


def __getattr__(name: str) -> Any:
    if name in ("LocalEngine", "sampling_logprobs"):
        from asyncrl.engines.local import engine

        return getattr(engine, name)
    if name == "VLLMEngine":
        from asyncrl.engines.vllm.inprocess import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module 'asyncrl.engines' has no attribute {name!r}")
