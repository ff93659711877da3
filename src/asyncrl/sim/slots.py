"""The simulated fleet's generation slots: a counting semaphore, FIFO, with a
synchronous fast path.

``asyncio.Semaphore`` would do, but every group of a simulation passes through
it: its ``acquire`` is a coroutine even when a slot is free and ``locked()``
scans the waiters. Here a free slot is taken without awaiting anything, and a
released slot is handed straight to the longest waiter.
"""

from __future__ import annotations

import asyncio
import collections


class SlotPool:
    """``size`` slots; groups beyond them wait in arrival order."""

    __slots__ = ("_free", "_owed", "_waiters", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self._free = size
        #: Slots a shrink removed while they were busy: each is retired when
        #: its group gives it back (drain), instead of going to a waiter.
        self._owed = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def try_take(self) -> bool:
        """Take a free slot at once (nobody waits for one); False: none is free."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def take(self) -> None:
        """Wait for a slot, behind everyone who waits already."""
        if self.try_take():
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.give_back()  # handed a slot, then cancelled before using it
            raise

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
        """Free a slot: the longest waiter still waiting gets it (unless a
        shrink retires it)."""
        if self._owed:
            self._owed -= 1
            return
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1
