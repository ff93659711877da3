"""``TrainerVersion``: the event-driven counter that admission waits on."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl._signal import ChangeSignal


class TrainerVersion:
    """Number of optimizer steps whose weights the rollout engines hold.

    The controller calls :meth:`set` only after a weight sync completes, so a
    waiter that sees version ``v`` knows every engine generates with weights
    ``>= v``. Waiters wake on change; nothing polls.
    """

    def __init__(self, value: int = 0) -> None:
        if value < 0:
            raise ValueError(f"TrainerVersion must start at >= 0, got {value}")
        self._value = value
        self._signal = ChangeSignal()

    @property
    def value(self) -> int:
        return self._value

    def set(self, value: int) -> None:
        """Set the version; it may only move forward."""
        if value < self._value:
            raise ValueError(
                f"TrainerVersion may only increase (current {self._value}, asked {value})"
            )
        if value != self._value:
            self._value = value
            self._signal.fire()

    async def wait_until(self, predicate: Callable[[int], bool]) -> int:
        """Wait until ``predicate(value)`` holds; return the value that satisfied it."""
        while not predicate(self._value):
            await self._signal.wait()
        return self._value

    def __repr__(self) -> str:
        return f"TrainerVersion({self._value})"
