"""A level-free change signal: ``await wait()`` returns at the next ``fire()``.

Each fire() wakes every task waiting at that moment exactly once; later
waiters wait for the *next* change. This is the one primitive the runtime
waits on; nothing polls. A fire() with nobody waiting costs nothing (the
waiter list is created by the first waiter), which matters on the
controller's hot path where most fires find no waiter.

Each waiter awaits a future of its own rather than an ``asyncio.Event``: the
Event's ``wait`` is a coroutine with its own bookkeeping, and a woken task
resumed it and ours on every wake-up, hundreds of times per simulated step
(issue 33). A waiter cancelled meanwhile leaves its cancelled future in the
list; fire() passes it by, and a long list is pruned as waiters join (a task
that waits with a timeout, over and over, without a fire, must not grow it).
"""

from __future__ import annotations

import asyncio

#: Waiters the list may hold before a join first prunes the ones cancelled meanwhile.
_PRUNE_AT = 32


class ChangeSignal:
    __slots__ = ("_prune_at", "_waiters")

    def __init__(self) -> None:
        self._waiters: list[asyncio.Future[None]] | None = None
        self._prune_at = _PRUNE_AT

    def fire(self) -> None:
        waiters = self._waiters
        if waiters is not None:
            self._waiters = None
            self._prune_at = _PRUNE_AT
            for future in waiters:
                if not future.done():  # its waiter was cancelled
                    future.set_result(None)

    def wait(self) -> asyncio.Future[None]:
        """An awaitable that completes at the next fire(); call it from the
        running loop, then await it (``await signal.wait()``)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters
        if waiters is None:
            self._waiters = [future]
        else:
            if len(waiters) >= self._prune_at:
                waiters[:] = [f for f in waiters if not f.done()]
                # The live ones stay: the next prune waits for the list to double,
                # so a join costs O(1) amortized however many tasks wait.
                self._prune_at = max(_PRUNE_AT, 2 * len(waiters))
            waiters.append(future)
        return future
