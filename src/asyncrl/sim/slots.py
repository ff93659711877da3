"""The simulated fleet's generation slots: a counting semaphore, FIFO, that
hands a freed slot straight to the longest waiter's start.

``asyncio.Semaphore`` would do, but every group of a simulation passes through
it, most of them waiting (a controller keeps more groups in flight than there
are slots): a waiter that is a future costs a task wake-up and an event-loop
pass per group just to take its slot. Here a waiter is the group's run, and the
call that frees a slot starts the next run then and there (``start``); the
group's task wakes once, when its generation ends.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Generic, TypeVar

W = TypeVar("W")


def _call(waiter: Callable[[], bool]) -> bool:
    return waiter()


class SlotPool(Generic[W]):
    """``size`` slots; waiters beyond them are started in arrival order.

    ``start(waiter)`` runs when a slot is handed to ``waiter`` and returns
    whether it took it (False: the waiter is gone - cancelled or aborted while
    it waited - and the slot goes on to the next one). By default a waiter is
    itself that callable: ``waiter()``."""

    __slots__ = ("_free", "_owed", "_start", "_waiters", "size")

    def __init__(self, size: int, start: Callable[[W], bool] = _call) -> None:
        self.size = size
        self._free = size
        self._start = start
        #: Slots a shrink removed while they were busy: each is retired when
        #: its group gives it back (drain), instead of going to a waiter.
        self._owed = 0
        self._waiters: collections.deque[W] = collections.deque()

    def try_take(self) -> bool:
        """Take a free slot at once (nobody waits for one); False: none is free."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    def wait(self, waiter: W) -> None:
        """Queue ``waiter`` behind everyone who waits already (after a failed
        :meth:`try_take`); a freed slot calls ``start(waiter)`` in its turn."""
        self._waiters.append(waiter)

    def resize(self, size: int) -> None:
        """Grow to ``size`` slots (new ones go to the waiters first) or shrink
        to it: free slots go at once, busy ones when their group gives them
        back. Invariant: free + busy - owed == size once the drain is over."""
        delta = size - self.size
        self.size = size
        if delta >= 0:
            repaid = min(delta, self._owed)  # a shrink not yet drained is undone first
            self._owed -= repaid
            for _ in range(delta - repaid):
                self.give_back()
            return
        gone = min(-delta, self._free)
        self._free -= gone
        self._owed += -delta - gone

    def give_back(self) -> None:
        """Free a slot: the longest waiter that still wants one starts on it
        (unless a shrink retires it)."""
        if self._owed:
            self._owed -= 1
            return
        waiters, start = self._waiters, self._start
        while waiters:
            if start(waiters.popleft()):
                return
        self._free += 1
