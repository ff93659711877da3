"""Rollout engines: the protocol, the built-in in-process engine and the vLLM engine.

``LocalEngine`` and ``VLLMEngine`` are imported on first use, so that importing
the protocol does not import torch (nor vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.engines.base import RolloutEngine

if TYPE_CHECKING:
    from asyncrl.engines.local import LocalEngine, sampling_logprobs
    from asyncrl.engines.vllm import VLLMEngine

__all__ = ["LocalEngine", "RolloutEngine", "VLLMEngine", "sampling_logprobs"]


def __getattr__(name: str) -> Any:
    if name in ("LocalEngine", "sampling_logprobs"):
        from asyncrl.engines import local

        return getattr(local, name)
    if name == "VLLMEngine":
        from asyncrl.engines.vllm import VLLMEngine

        return VLLMEngine
    raise AttributeError(f"module 'asyncrl.engines' has no attribute {name!r}")
