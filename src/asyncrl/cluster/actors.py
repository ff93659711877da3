"""What runs inside the Ray actors: the in-process engine and trainer, unchanged.

Both are *async actors* (their methods are coroutines), so the actor runs one
asyncio loop and the wrapped ``LocalEngine`` / ``GRPOTrainer`` work exactly as
they do in-process: concurrent ``generate`` calls share the engine's batches,
heavy work runs in the backends' own worker threads.

These classes are plain Python; :mod:`asyncrl.cluster.backend` turns them into
actor classes with ``ray.remote`` when a run starts, so importing this module
does not import Ray.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncrl._util.bounded import append_bounded

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig
    from asyncrl.engines.options import EngineOptions
    from asyncrl.tasks.base import Task
    from asyncrl.trainers.options import TrainerOptions
    from asyncrl.types import GenerationRequest, GroupId, GroupResult, Rollout


def worker_seed(seed: int, index: int, incarnation: int) -> int:
    """The sampling seed of one incarnation of one rollout worker: workers must not
    draw the same random stream, and a restarted worker must not replay the
    draws of the one it replaces."""
    digest = hashlib.blake2b(f"{seed}:{index}:{incarnation}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def _node_info() -> dict[str, Any]:
    import ray

    return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id()}


class EngineWorker:
    """A rollout worker: the engine ``policy.engine`` names, built by
    :func:`asyncrl.engines.build_engine` with the run's :class:`EngineOptions`
    (so exactly as in-process, but with a sampling seed of its own), in an actor.

    It starts from ``weights`` at ``version`` (the trainer's newest weights, so a
    restarted worker resumes exactly where the run is) and records every version
    it loads, in order, for the driver to check. A vLLM engine starts from those
    weights saved to a temporary directory on the worker's node; its processes
    end with the actor, also when Ray kills it.
    """

    def __init__(
        self,
        policy: PolicyConfig,
        options: EngineOptions,
        task: Task,
        index: int,
        incarnation: int,
        weights: dict[str, Any],
        version: int,
    ) -> None:
        from asyncrl.engines.capabilities import EngineCapabilities
        from asyncrl.engines.factory import build_engine
        from asyncrl.policy.build import build_policy

        model, tokenizer = build_policy(policy, task, seed=options.seed)
        options = dataclasses.replace(
            options, seed=worker_seed(options.seed, index, incarnation), work_dir=None)
        self.engine: Any = build_engine(policy, options, model=model, tokenizer=tokenizer,
                                        weights=weights, weight_version=version)
        self.capabilities = EngineCapabilities.of(self.engine)
        self.version = version
        self.loaded = [version]

    def ready(self) -> dict[str, Any]:
        return {**_node_info(), "version": self.version,
                "capabilities": dataclasses.asdict(self.capabilities)}

    async def generate(self, request: GenerationRequest) -> GroupResult:
        return await self.engine.generate(request)

    async def update_weights(self, weights: dict[str, Any], version: int) -> int:
        await self.engine.update_weights(weights, version)
        self.version = version
        append_bounded(self.loaded, version)  # the newest versions of a long run
        return version

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        await self.engine.abort(group_ids)

    async def snapshot(self, group_ids: Sequence[GroupId]) -> dict[GroupId, GroupResult]:
        return await self.engine.snapshot(group_ids)

    async def invalidate_cache(self) -> None:
        await self.engine.invalidate_cache()

    async def pressure(self) -> Any:
        """Called only where the capabilities declare it (asyncrl.engines.ReportsPressure)."""
        return await self.engine.pressure()

    def loaded_versions(self) -> list[int]:
        return list(self.loaded)

    async def close(self) -> None:
        await self.engine.close()


class TrainerWorker:
    """The trainer actor: the :class:`~asyncrl.trainers.grpo.GRPOTrainer` of
    ``options`` over the policy of ``policy``."""

    def __init__(self, policy: PolicyConfig, options: TrainerOptions, task: Task,
                 seed: int) -> None:
        from asyncrl.policy.build import build_policy
        from asyncrl.trainers.grpo import GRPOTrainer

        model, tokenizer = build_policy(policy, task, seed=seed)
        self.trainer = GRPOTrainer.from_options(options, model=model, tokenizer=tokenizer)

    def ready(self) -> dict[str, Any]:
        return {**_node_info(), "version": self.trainer.version}

    async def train_chunk(self, rollouts: list[Rollout], step: int) -> dict[str, float]:
        return await self.trainer.train_chunk(rollouts, step=step)

    async def finish_step(self, step: int) -> dict[str, float]:
        return await self.trainer.finish_step(step=step)

    async def get_weights(self) -> tuple[int, dict[str, Any]]:
        # Called with num_returns=2: the driver awaits only the small version
        # object and hands the weights on as an ObjectRef, never fetching them.
        weights = await self.trainer.get_weights()
        return self.trainer.version, weights

    def state_dict(self) -> dict[str, Any]:
        return self.trainer.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> int:
        self.trainer.load_state_dict(state)
        return self.trainer.version

    async def close(self) -> None:
        await self.trainer.close()
