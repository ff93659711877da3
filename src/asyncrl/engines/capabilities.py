"""What an engine can do beyond :class:`~asyncrl.engines.RolloutEngine`.

Each optional capability is a small protocol. The controller reads an engine's
capabilities ONCE, when it is handed the engine (:meth:`EngineCapabilities.of`),
and calls an optional member only where the engine has it; ``asyncrl validate``
prints them. An engine whose members live elsewhere (the Ray proxy forwards to a
worker's engine) declares them instead, as a ``capabilities`` attribute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Protocol, runtime_checkable

from asyncrl._util.capabilities import Capabilities
from asyncrl.types import GroupId, GroupResult

__all__ = [
    "Aborts",
    "EngineCapabilities",
    "EnginePressure",
    "InvalidatesCache",
    "PinsVersions",
    "ReportsHealth",
    "ReportsPressure",
    "RetainsWeights",
    "Snapshots",
    "WeightsOnDevice",
]


@runtime_checkable
class Aborts(Protocol):
    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        """Called when the sampler calls in-flight groups hopeless after a weight
        sync, at a graceful stop, and at shutdown: stop spending compute on them.
        Their ``generate`` raises :class:`~asyncrl.types.GroupAborted`, with the
        tokens they had as ``partial`` when the engine can give them (a stop keeps
        them for the resume). Without it the controller only cancels the groups'
        ``generate`` calls."""
        ...


@runtime_checkable
class InvalidatesCache(Protocol):
    async def invalidate_cache(self) -> None:
        """Called after a weight sync when the sampler is on-policy or
        ``recompute_kv_cache_after_weight_updates`` is set: drop KV/prefix caches
        computed with older weights."""
        ...


@runtime_checkable
class Snapshots(Protocol):
    async def snapshot(self, group_ids: Sequence[GroupId]) -> dict[GroupId, GroupResult]:
        """Called before a checkpoint is written while groups generate: the tokens
        each has so far, without stopping it. Without it a checkpoint keeps only
        those groups' prompts (docs/partial_rollouts.md)."""
        ...


@runtime_checkable
class ReportsHealth(Protocol):
    @property
    def healthy(self) -> bool:
        """Read each time the controller picks an engine for an attempt: an
        unhealthy engine is not picked while another is healthy."""
        ...


@runtime_checkable
class PinsVersions(Protocol):
    """Deterministic runs (``deterministic: true``): requests pinned to older weights."""

    async def retain_weight_versions(self, versions: Collection[int]) -> None:
        """Called after every weight sync: keep only these versions (and the current)."""
        ...


@runtime_checkable
class RetainsWeights(Protocol):
    """Deterministic runs: the pinned versions kept, saved in checkpoints."""

    def retained_weights(self) -> dict[int, Any]:
        """Called when a checkpoint is written: the versions kept."""
        ...

    def restore_retained(self, snapshots: dict[int, Any]) -> None:
        """Called on resume, after ``update_weights``: the older versions kept."""
        ...


@runtime_checkable
class WeightsOnDevice(Protocol):
    @property
    def device(self) -> Any:
        """Read once when the backends are built: the device the trainer hands the
        weights over on (without it: the CPU)."""
        ...


@dataclasses.dataclass(frozen=True)
class EnginePressure:
    """How loaded an engine is, as it reports it (:class:`ReportsPressure`)."""

    #: Requests (sequences) generating now.
    running: int
    #: Requests the engine holds but cannot run yet (waiting for capacity).
    waiting: int
    #: Fraction of the KV cache in use, in [0, 1]; None where the engine has no
    #: such number. Where the engine can, the highest since its last report (a
    #: spike between two reads counts: the in-process vLLM engine); else now.
    kv_cache_usage: float | None
    #: Requests the engine preempted (evicted from the KV cache to be recomputed
    #: later) since it started: a counter that only grows.
    preemptions: int
    #: How many engines (or servers) answered for these numbers: a counter
    #: summed over a different set of them is no continuation of the last one.
    sources: int = 1

    def __post_init__(self) -> None:
        counts = {"running": self.running, "waiting": self.waiting,
                  "preemptions": self.preemptions}
        for name, value in counts.items():
            if value < 0:
                raise ValueError(f"EnginePressure.{name} is {value}; it counts requests and "
                                 "must be >= 0")
        kv = self.kv_cache_usage
        if kv is not None and not 0.0 <= kv <= 1.0:
            raise ValueError(f"EnginePressure.kv_cache_usage is {kv}; report the fraction of "
                             "the KV cache in use, in [0, 1] (None: not known)")

    @classmethod
    def combine(cls, parts: Iterable[EnginePressure | None]) -> EnginePressure | None:
        """Several engines (or servers) as one: the counts add up, the KV-cache
        usage is the highest one reported (the fullest engine is the one that
        thrashes); None when none reports anything."""
        got = [p for p in parts if p is not None]
        if not got:
            return None
        kv = [p.kv_cache_usage for p in got if p.kv_cache_usage is not None]
        return cls(sum(p.running for p in got), sum(p.waiting for p in got),
                   max(kv) if kv else None, sum(p.preemptions for p in got),
                   sum(p.sources for p in got))


@runtime_checkable
class ReportsPressure(Protocol):
    async def pressure(self) -> EnginePressure | None:
        """Called at a step boundary by ``async_rl.autopilot`` (``mode: aimd``),
        once per decision: how loaded the engine is now (None: it cannot say
        now). The train pump waits for it, so it must be quick: read numbers the
        engine keeps up to date, or one short local request (a server's
        ``/metrics``); never block the event loop."""
        ...


#: Each capability (a field of EngineCapabilities) with the members it needs.
_MEMBERS: dict[str, tuple[str, ...]] = {
    "abort": ("abort",),
    "invalidate_cache": ("invalidate_cache",),
    "snapshot": ("snapshot",),
    "healthy": ("healthy",),
    "pinned_versions": ("retain_weight_versions",),
    "retained_weights": ("retained_weights", "restore_retained"),
    "device": ("device",),
    "fleet": ("fleet",),
    "pressure": ("pressure",),
}


@dataclasses.dataclass(frozen=True)
class EngineCapabilities(Capabilities):
    """Which optional protocols an engine satisfies (one flag per protocol)."""

    MEMBERS: ClassVar[Mapping[str, tuple[str, ...]]] = _MEMBERS
    REQUIRED: ClassVar[tuple[str, ...]] = ("generate", "update_weights", "close")
    PROTOCOL: ClassVar[str] = "asyncrl.engines.RolloutEngine"

    abort: bool = False
    invalidate_cache: bool = False
    snapshot: bool = False
    healthy: bool = False
    pinned_versions: bool = False
    retained_weights: bool = False
    device: bool = False
    #: An ElasticFleet in ``fleet`` (asyncrl.engines.fleet): ``asyncrl fleet`` changes it.
    fleet: bool = False
    #: Reports its load (:class:`ReportsPressure`): the aimd autopilot reads it.
    pressure: bool = False

    @classmethod
    def of(cls, engine: Any) -> EngineCapabilities:
        """The capabilities of an engine, or of an engine class (``asyncrl
        validate`` reads them before anything is built); an engine that declares
        them (a ``capabilities`` attribute: the Ray proxy) has those."""
        # Read as an attribute: an engine that wraps another (a rollout function's)
        # may forward it.
        declared = getattr(engine, "capabilities", None)
        if isinstance(declared, EngineCapabilities):
            return declared
        return super().of(engine)
