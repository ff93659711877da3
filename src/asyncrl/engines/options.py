"""What every engine is built from besides its policy block: the run-level
:class:`EngineOptions`, and the :class:`EngineContext` a custom engine's
constructor gets (see :mod:`asyncrl.engines.factory`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from asyncrl.config import AsyncRLConfig, GenerationConfig, PolicyConfig
    from asyncrl.tasks.tokenizer import Tokenizer

__all__ = ["EngineContext", "EngineOptions"]


@dataclasses.dataclass(frozen=True)
class EngineOptions:
    """The run-level settings an engine takes besides ``policy`` (picklable: Ray
    workers get them as they are)."""

    #: Sampling seed (a Ray worker gets one of its own, from this one).
    seed: int = 0
    #: Deterministic runs: keep the weight versions pinned requests ask for.
    pin_versions: bool = False
    #: Drop every KV cache at each weight load (async_rl.recompute_kv_cache_after_weight_updates).
    recompute_kv_on_update: bool = False
    #: The run directory (engines that save files put them there; None: a temporary one).
    work_dir: str | None = None

    @classmethod
    def of(cls, policy: PolicyConfig, async_rl: AsyncRLConfig, *, seed: int = 0,
           deterministic: bool = False, work_dir: str | Path | None = None) -> EngineOptions:
        """The options of the ``policy`` and ``async_rl`` blocks, the run's ``seed``
        and ``deterministic``, and its directory."""
        from asyncrl.engines.specs import engine_spec

        reads_vllm = engine_spec(policy).reads_vllm_block
        vllm_seed = policy.vllm.seed if reads_vllm else None
        return cls(
            seed=seed if vllm_seed is None else vllm_seed,
            pin_versions=deterministic,
            recompute_kv_on_update=async_rl.recompute_kv_cache_after_weight_updates,
            work_dir=None if work_dir is None else str(work_dir),
        )


@dataclasses.dataclass(frozen=True)
class EngineContext:
    """What a custom engine's constructor gets first: the policy (already holding
    the weights of ``weight_version``; the engine owns it), its tokenizer, the
    sampling settings and the run's engine options."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    generation: GenerationConfig
    options: EngineOptions
    weight_version: int = 0
