"""A level-free change signal: ``await wait()`` returns at the next ``fire()``.

Each fire() sets the current event and installs a fresh one, so every waiter
that was waiting wakes exactly once and later waiters wait for the *next*
change. This is the one primitive the runtime waits on; nothing polls.
"""

from __future__ import annotations

import asyncio


class ChangeSignal:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def fire(self) -> None:
        event, self._event = self._event, asyncio.Event()
        event.set()

    async def wait(self) -> None:
        await self._event.wait()
