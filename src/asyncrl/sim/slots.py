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

    __slots__ = ("_free", "_waiters")

    def __init__(self, size: int) -> None:
        self._free = size
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

    def give_back(self) -> None:
        """Free a slot: the longest waiter still waiting gets it."""
        waiters = self._waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self._free += 1
