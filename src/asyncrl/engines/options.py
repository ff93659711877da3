"""What every engine is built from besides its policy block: the run-level
:class:`EngineOptions`, and the :class:`EngineContext` a custom engine's
constructor gets (see :mod:`asyncrl.engines.factory`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from asyncrl.config import GenerationConfig, RunConfig
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
    def of(cls, cfg: RunConfig, work_dir: str | Path | None = None) -> EngineOptions:
        """The options a run config implies (its one place that reads the whole run)."""
        from asyncrl.engines.specs import engine_spec

        reads_vllm = engine_spec(cfg.policy).reads_vllm_block
        vllm_seed = cfg.policy.vllm.seed if reads_vllm else None
        return cls(
            seed=cfg.seed if vllm_seed is None else vllm_seed,
            pin_versions=cfg.deterministic,
            recompute_kv_on_update=cfg.async_rl.recompute_kv_cache_after_weight_updates,
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
