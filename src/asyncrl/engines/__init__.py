"""Rollout engines: the protocol, and the built-in in-process engine.

``LocalEngine`` is imported on first use, so that importing the protocol does
not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asyncrl.engines.base import RolloutEngine

if TYPE_CHECKING:
    from asyncrl.engines.local import LocalEngine, sampling_logprobs

__all__ = ["LocalEngine", "RolloutEngine", "sampling_logprobs"]


def __getattr__(name: str) -> Any:
    if name in ("LocalEngine", "sampling_logprobs"):
        from asyncrl.engines import local

        return getattr(local, name)
    raise AttributeError(f"module 'asyncrl.engines' has no attribute {name!r}")
