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
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from asyncrl.run.options import engine_options, sharded_options, trainer_options

if TYPE_CHECKING:
    from pathlib import Path

    from asyncrl.config import RunConfig
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.policy.build import PolicyTokenizer
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.base import Trainer
    from asyncrl.trainers.grpo import GRPOTrainer

log = logging.getLogger("asyncrl.runner")


def own_backend(stack: contextlib.AsyncExitStack, backend: Any) -> Any:
    """``backend`` (an engine, a trainer, a reward pool: anything with ``async
    close()``) is closed when ``stack`` unwinds, on every path: after a failing
    or cancelled close before it too. A close that fails is logged, so that it
    never hides how the run ended."""

    async def close() -> None:
        try:
            await backend.close()
        except Exception as exc:
            log.warning("closing %s failed: %r", type(backend).__name__, exc)

    stack.push_async_callback(close)
    return backend


def build_backends(
    cfg: RunConfig, task: Task, work_dir: str | Path | None = None, *,
    policy_tokenizer: PolicyTokenizer | None = None,
) -> tuple[list[RolloutEngine], Trainer]:
    """The engines and the trainer for ``cfg.cluster.backend`` and ``cfg.policy.engine``.

    ``work_dir`` (the run directory): where the vLLM engine finds the from-scratch
    model saved for it (a temporary directory when None). ``policy_tokenizer``:
    the run's, handed to the policy built here (None: read for it); a Ray worker
    loads its own.
    """
    if cfg.cluster.backend == "ray":
        from asyncrl.cluster import build_ray_backends

        return build_ray_backends(
            cfg.cluster, cfg.policy, task, engine_options=engine_options(cfg),
            trainer_options=trainer_options(cfg), seed=cfg.seed,
            sharded=sharded_options(cfg) if cfg.trainer.strategy == "fsdp" else None)
    if cfg.trainer.strategy == "fsdp":
        return build_sharded_backends(cfg, task, work_dir=work_dir,
                                      policy_tokenizer=policy_tokenizer)
    engine, trainer = build_local_backends(cfg, task, work_dir=work_dir,
                                           policy_tokenizer=policy_tokenizer)
    return [engine], trainer


def build_local_backends(
    cfg: RunConfig, task: Task, *, work_dir: str | Path | None = None,
    policy_tokenizer: PolicyTokenizer | None = None,
) -> tuple[RolloutEngine, GRPOTrainer]:
    """The in-process trainer and its engine, from one policy built once.

    ``LocalEngine`` gets its own copy of the model (it generates in a thread of
    its own while the trainer updates its weights); ``VLLMEngine`` loads the
    model from a Hugging Face directory in processes of its own.
    """
    from asyncrl.trainers.grpo import GRPOTrainer

    model, tokenizer = _policy(cfg, task, policy_tokenizer)
    engine, weights_device = _engine(cfg, model, tokenizer, work_dir, shared=True)
    with _closed_on_failure(engine):
        trainer = GRPOTrainer.from_options(trainer_options(cfg), model=model, tokenizer=tokenizer,
                                           weights_device=weights_device)
    return engine, trainer


def build_sharded_backends(
    cfg: RunConfig, task: Task, *, work_dir: str | Path | None = None,
    policy_tokenizer: PolicyTokenizer | None = None,
) -> tuple[list[RolloutEngine], Trainer]:
    """The engine in this process and the sharded trainer (``trainer.strategy: fsdp``)
    in ``trainer.world_size`` rank processes, each building the same policy."""
    from asyncrl.trainers.distributed import build_local_trainer

    model, tokenizer = _policy(cfg, task, policy_tokenizer)
    engine, weights_device = _engine(cfg, model, tokenizer, work_dir, shared=False)
    with _closed_on_failure(engine):
        trainer = build_local_trainer(sharded_options(cfg), task,
                                      startup_timeout_s=cfg.cluster.actor_startup_timeout_s,
                                      weights_device=str(weights_device), run_dir=work_dir)
    return [engine], trainer


def _policy(cfg: RunConfig, task: Task,
            policy_tokenizer: PolicyTokenizer | None) -> tuple[Any, Any]:
    """The policy's model and tokenizer (the run's, when it has one already)."""
    from asyncrl.policy.build import build_policy

    given = policy_tokenizer.get(task) if policy_tokenizer is not None else None
    return build_policy(cfg.policy, task, seed=cfg.seed, tokenizer=given)


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
    from asyncrl.engines.factory import build_engine
    from asyncrl.engines.specs import engine_spec

    # An engine that loads a saved copy into its own processes (vLLM) needs no copy.
    copied = shared and engine_spec(cfg.policy).uses_given_model
    engine = build_engine(cfg.policy, engine_options(cfg, work_dir),
                          model=copy.deepcopy(model) if copied else model, tokenizer=tokenizer)
    # Weights go straight to the engine's device (on a GPU, never through the
    # host); an engine that loads them elsewhere (vLLM) takes them on the CPU.
    return engine, engine.device if EngineCapabilities.of(engine).device else "cpu"
