"""``TrainerVersion``: the event-driven counter that admission waits on."""

from __future__ import annotations

from collections.abc import Callable

from asyncrl._util.change_signal import ChangeSignal


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
        #: For every waiter inside :meth:`wait_until`: the value at which it last
        #: found its predicate false. A waiter whose entry equals the current
        #: value is known to be blocked; an older entry means it has been woken
        #: and will look again.
        self._blocked_at: dict[object, int] = {}
        #: Called whenever a waiter blocks (the controller wakes its train pump,
        #: which may be deciding whether anything more can arrive).
        self.on_block: Callable[[], None] | None = None

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
        token = object()
        try:
            while not predicate(self._value):
                self._blocked_at[token] = self._value
                if self.on_block is not None:
                    self.on_block()
                await self._signal.wait()
        finally:
            self._blocked_at.pop(token, None)
        return self._value

    def recheck(self) -> None:
        """Wake every waiter to test its predicate again without a new value: a
        predicate that reads more than the value (the admission gate reads the
        sampler's live window) may hold now. Until each has looked again, none
        counts as blocked (:meth:`waiters_blocked`)."""
        for token in self._blocked_at:
            self._blocked_at[token] = -1  # never equal to a value: "woken, will look"
        self._signal.fire()

    def waiters_blocked(self) -> bool:
        """True when someone waits in :meth:`wait_until` and every waiter has
        found its predicate false at the current value (none can go on until
        the value changes)."""
        value = self._value
        return bool(self._blocked_at) and all(v == value for v in self._blocked_at.values())

    def __repr__(self) -> str:
        return f"TrainerVersion({self._value})"
