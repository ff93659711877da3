"""A level-free change signal: ``await wait()`` returns at the next ``fire()``.

Each fire() wakes every task waiting at that moment exactly once; later
waiters wait for the *next* change. This is the one primitive the runtime
waits on; nothing polls. A fire() with nobody waiting costs nothing (the
event is created by the first waiter), which matters on the controller's hot
path where most fires find no waiter.
"""

from __future__ import annotations

import asyncio


class ChangeSignal:
    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None

    def fire(self) -> None:
        event = self._event
        if event is not None:
            self._event = None
            event.set()

    async def wait(self) -> None:
        event = self._event
        if event is None:
            event = self._event = asyncio.Event()
        await event.wait()
