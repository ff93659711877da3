"""Build the rollout engines and the trainer a run config names.

This is the one place that knows every backend: :mod:`asyncrl.policy.build` builds
models, :mod:`asyncrl.engines` and :mod:`asyncrl.trainers` wrap them, and the
runner (or a library user) calls :func:`build_backends`. Nothing below imports
this module, so the layers stay acyclic.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    from asyncrl.config import RunConfig
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.base import Trainer
    from asyncrl.trainers.grpo import GRPOTrainer


def build_backends(
    cfg: RunConfig, task: Task, work_dir: str | Path | None = None
) -> tuple[list[RolloutEngine], Trainer]:
    """The engines and the trainer for ``cfg.cluster.backend`` and ``cfg.policy.engine``.

    ``work_dir`` (the run directory): where the vLLM engine finds the from-scratch
    model saved for it (a temporary directory when None).
    """
    if cfg.cluster.backend == "ray":
        from asyncrl.cluster import build_ray_backends

        return build_ray_backends(cfg, task)
    if cfg.trainer.strategy == "fsdp":
        return build_sharded_backends(cfg, task, work_dir=work_dir)
    engine, trainer = build_local_backends(cfg, task, work_dir=work_dir)
    return [engine], trainer


def build_local_backends(
    cfg: RunConfig, task: Task, *, work_dir: str | Path | None = None
) -> tuple[RolloutEngine, GRPOTrainer]:
    """The in-process trainer and its engine, from one policy built once.

    ``LocalEngine`` gets its own copy of the model (it generates in a thread of
    its own while the trainer updates its weights); ``VLLMEngine`` loads the
    model from a Hugging Face directory in processes of its own.
    """
    from asyncrl.policy.build import build_policy
    from asyncrl.trainers.grpo import GRPOTrainer

    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    engine, weights_device = _engine(cfg, model, tokenizer, work_dir, shared=True)
    with _closed_on_failure(engine):
        trainer = GRPOTrainer.from_config(cfg.policy, cfg.loss, model=model, tokenizer=tokenizer,
                                          deterministic=cfg.deterministic,
                                          weights_device=weights_device)
    return engine, trainer


def build_sharded_backends(
    cfg: RunConfig, task: Task, *, work_dir: str | Path | None = None
) -> tuple[list[RolloutEngine], Trainer]:
    """The engine in this process and the sharded trainer (``trainer.strategy: fsdp``)
    in ``trainer.world_size`` rank processes, each building the same policy."""
    from asyncrl.policy.build import build_policy
    from asyncrl.trainers.distributed import build_local_trainer

    model, tokenizer = build_policy(cfg.policy, task, seed=cfg.seed)
    engine, weights_device = _engine(cfg, model, tokenizer, work_dir, shared=False)
    with _closed_on_failure(engine):
        trainer = build_local_trainer(cfg, task, weights_device=str(weights_device),
                                      run_dir=work_dir)
    return [engine], trainer


@contextlib.contextmanager
def _closed_on_failure(engine: RolloutEngine) -> Iterator[None]:
    """Close ``engine`` if the trainer cannot be built (or Ctrl-C comes meanwhile):
    a vLLM engine's processes must not outlive the failed start."""
    try:
        yield
    except BaseException:
        asyncio.run(engine.close())
        raise


def _engine(cfg: RunConfig, model: Any, tokenizer: Any, work_dir: str | Path | None, *,
            shared: bool) -> tuple[RolloutEngine, Any]:
    """The engine ``policy.engine`` names over ``model``, and the device the
    trainer's weights are handed over on. ``shared``: an in-process trainer
    updates ``model``, so the engine (which generates concurrently) gets a copy."""
    from asyncrl.engines.capabilities import EngineCapabilities
    from asyncrl.engines.factory import EngineOptions, build_engine

    # vLLM (in process or servers) only saves the model for its own processes: no copy needed.
    copied = shared and cfg.policy.engine not in ("vllm", "vllm_server")
    engine = build_engine(cfg.policy, EngineOptions.of(cfg, work_dir),
                          model=copy.deepcopy(model) if copied else model, tokenizer=tokenizer)
    # Weights go straight to the engine's device (on a GPU, never through the
    # host); an engine that loads them elsewhere (vLLM) takes them on the CPU.
    return engine, engine.device if EngineCapabilities.of(engine).device else "cpu"
