"""Classes that a ``custom`` sampler target must be rejected for, one flaw each.

Imported by module path (``bad_samplers:ClassName``) from ``test_custom.py``,
which puts this directory on ``sys.path``.
"""

from __future__ import annotations

from typing import Any

from asyncrl.sampling import BaseSampler


class NoArgsSampler:
    """Its constructor takes nothing, so the buffer cannot be passed."""

    def __init__(self) -> None:
        self.ready = True


class KeywordOnlySampler(BaseSampler):
    """Everything is keyword-only: the buffer cannot be passed first."""

    def __init__(self, *, buffer: Any = None, max_staleness_versions: int = 1) -> None:
        super().__init__(buffer)
        self.window = max_staleness_versions


class BufferSecondSampler(BaseSampler):
    """Takes something else before the buffer."""

    def __init__(self, name: str, buffer: Any) -> None:
        super().__init__(buffer)
        self.name = name


class StrictSampler(BaseSampler):
    """A fine sampler whose constructor knows only ``window``."""

    def __init__(self, buffer: Any, window: int = 1) -> None:
        super().__init__(buffer)
        self.window = window


class IncompleteSampler:
    """Has a select, but none of the other members of the protocol."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer

    async def select(self, **kwargs: Any) -> None:
        return None


class SyncAdmitSampler(BaseSampler):
    """Every member is there, but admit is a plain function: the pump must await it."""

    def admit(self, *, trainer_version: Any) -> int | None:  # type: ignore[override]
        return None

    async def select(self, **kwargs: Any) -> None:
        return None


class SyncAdmitIncompleteSampler:
    """A plain-def admit and nothing else: both problems are named, each as what it is."""

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer

    def admit(self, *, trainer_version: Any) -> int | None:
        return None


NOT_CALLABLE = 42


class RaisingSampler(BaseSampler):
    """Its constructor fails on its own (a config value it rejects)."""

    def __init__(self, buffer: Any, window: int = 1) -> None:
        super().__init__(buffer)
        raise RuntimeError(f"window {window} is not supported")


class NoSelectSampler(BaseSampler):
    """Subclasses BaseSampler but forgets select: it would die at step 0."""

    gated = True


class NegativeCapacitySampler(BaseSampler):
    """Reports a negative buffer capacity for a negative window."""

    def __init__(self, buffer: Any, window: int = 1) -> None:
        super().__init__(buffer)
        self.window = window

    async def select(self, **kwargs: Any) -> None:
        return None


class NotBoolOnPolicySampler(NegativeCapacitySampler):
    """Reports is_on_policy as a string."""

    @property
    def is_on_policy(self) -> Any:
        return "no"
