"""The protocols of a run's task, trainer and engines, as the pre-run checks see them.

Before anything is built, :func:`~asyncrl.run.preflight.preflight` checks that
each object has the required members of its protocol (one line naming those
missing), lists the optional capabilities each has (``asyncrl validate --json`` prints
them), and warns about a public attribute that looks like an optional member
misspelled. The built-in backends are read from their classes, the caller's
from the objects it hands in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from asyncrl._util.capabilities import Capabilities
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.engines.factory import engine_class, missing_engine_members
from asyncrl.errors import UsageError
from asyncrl.tasks.capabilities import TaskCapabilities
from asyncrl.trainers.capabilities import TrainerCapabilities

if TYPE_CHECKING:
    from asyncrl.config import RunConfig
    from asyncrl.engines.base import RolloutEngine
    from asyncrl.trainers.base import Trainer

    Backends = tuple[Sequence[RolloutEngine], Trainer]

__all__ = ["RunProtocols", "check_members", "trainer_class"]


def trainer_class(cfg: RunConfig) -> type:
    """The class of the trainer :func:`~asyncrl.run.backends.build_backends` builds
    for ``cfg`` (imported; nothing is built)."""
    if cfg.trainer.strategy == "fsdp":
        from asyncrl.trainers.distributed.trainer import DistributedTrainer

        return DistributedTrainer
    if cfg.cluster.backend == "ray":
        from asyncrl.cluster.proxies import RayTrainer  # says how to install Ray

        return RayTrainer
    from asyncrl.trainers.grpo import GRPOTrainer

    return GRPOTrainer


def check_members(obj: Any, caps: type[Capabilities], role: str) -> None:
    """Refuse ``obj`` (the caller's ``role``) when it lacks a required member."""
    missing = caps.missing_required(obj)
    if missing:
        raise UsageError(
            f"the {role} {type(obj).__name__} does not satisfy {caps.PROTOCOL}: it lacks "
            f"{', '.join(missing)}; implement them (docs/design.md lists each protocol's "
            "members and when they are called)")


@dataclasses.dataclass(frozen=True)
class RunProtocols:
    """The engine's and the trainer's capabilities, and their likely misspellings."""

    #: None: the caller's engines (several objects, which may differ).
    engine: EngineCapabilities | None
    trainer: TrainerCapabilities
    warnings: tuple[str, ...]

    @classmethod
    def of(cls, cfg: RunConfig, backends: Backends | None) -> RunProtocols:
        """The built-in backends' classes for ``cfg`` (imported, and a custom
        engine's checked), or the caller's ``backends`` (checked for the
        required members)."""
        if backends is None:
            engine: Any = engine_class(cfg.policy)
            trainer: Any = trainer_class(cfg)
            engines = [engine]
        else:
            engines, trainer = list(backends[0]), backends[1]
            for each in engines:
                missing = missing_engine_members(each)
                if missing:
                    raise UsageError(
                        f"the engine {type(each).__name__} does not satisfy "
                        f"{EngineCapabilities.PROTOCOL}: {'; '.join(missing)}; define each "
                        "required member as an 'async def' method (docs/engines.md)")
            check_members(trainer, TrainerCapabilities, "trainer")
        one_per_class = {type(e): e for e in engines}.values()
        warnings = [*(str(m) for e in one_per_class for m in EngineCapabilities.misspelled(e)),
                    *(str(m) for m in TrainerCapabilities.misspelled(trainer))]
        return cls(engine=EngineCapabilities.of(engines[0]) if backends is None else None,
                   trainer=TrainerCapabilities.of(trainer), warnings=tuple(warnings))

    def facts(self, task: Any) -> dict[str, Any]:
        """The capabilities held, by name, as ``asyncrl validate --json`` prints them."""
        return {
            "engine_capabilities": None if self.engine is None else self.engine.names(),
            "trainer_capabilities": self.trainer.names(),
            "task_capabilities": TaskCapabilities.of(task).names(),
        }

    def misspellings(self, task: Any) -> list[str]:
        """The warnings about names like optional members: the task's, then the backends'."""
        return [*(str(m) for m in TaskCapabilities.misspelled(task)), *self.warnings]

