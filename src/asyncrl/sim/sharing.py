"""Processor sharing: how a continuous-batching engine decodes under load.

Every group in its token phase gets one token per decode step, and a decode
step takes ``seconds_per_token(n)`` with ``n`` groups decoding: when a group
joins or leaves, every other one speeds up or slows down. The classic way to
simulate that without touching every group at every change is a *service
clock* ``S``: the number of tokens each decoding group has received so far,
which advances at ``1 / seconds_per_token(n)`` per second (0 while generation
is paused). A group that joins at ``S0`` needing ``k`` tokens is done when
``S = S0 + k``; only the earliest of those needs a timer. Joining, leaving and
finishing cost O(log n).

Token ``j`` (from 0) of a group that joined at ``S0`` is sampled at
``S = S0 + j + 1``, so weight updates recorded on the service clock split a
group's tokens exactly as for the time-based models (:mod:`asyncrl.sim.tokens`).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable

#: Targets within this many tokens of the clock are due (float rounding).
_EPS = 1e-9
#: The shortest decode step: a fitted model may put a lone group's at 0.
_MIN_STEP_S = 1e-9


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class SharedDecoder:
    """The service clock of one fleet (see the module docstring)."""

    def __init__(self, seconds_per_token: Callable[[int], float]) -> None:
        self._seconds_per_token = seconds_per_token
        self._service = 0.0
        self._at = 0.0
        self._decoding = 0
        self._paused = False
        # (target service, join number, future): the earliest finishes first.
        self._due: list[tuple[float, int, asyncio.Future[None]]] = []
        self._left: set[int] = set()  # join numbers of groups that left early
        self._count = itertools.count()
        self._timer: asyncio.TimerHandle | None = None

    def service(self, now: float) -> float:
        """The service clock at ``now`` (tokens per decoding group so far)."""
        self._advance(now)
        return self._service

    def join(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future[None],
             tokens: int) -> tuple[int, float]:
        """A group starts decoding ``tokens`` tokens; ``fut`` completes when it has
        them. Returns its join number (for :meth:`leave`) and its start on the clock."""
        start = self.service(loop.time())
        number = next(self._count)
        heapq.heappush(self._due, (start + tokens, number, fut))
        self._decoding += 1
        self._schedule(loop)
        return number, start

    def leave(self, loop: asyncio.AbstractEventLoop, number: int) -> None:
        """A decoding group stops early (aborted or cancelled)."""
        self._advance(loop.time())
        self._left.add(number)
        self._decoding -= 1
        self._schedule(loop)

    def pause(self, now: float) -> None:
        self._advance(now)
        self._paused = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def resume(self, loop: asyncio.AbstractEventLoop) -> None:
        self._at = loop.time()
        self._paused = False
        self._schedule(loop)

    # ------------------------------------------------------------ internals
    def _step_s(self, decoding: int) -> float:
        return max(self._seconds_per_token(decoding), _MIN_STEP_S)

    def _advance(self, now: float) -> None:
        if not self._paused and self._decoding > 0:
            self._service += (now - self._at) / self._step_s(self._decoding)
        self._at = now

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self._due
        while due and due[0][1] in self._left:
            self._left.discard(heapq.heappop(due)[1])
        if self._paused or not due:
            return
        wait = (due[0][0] - self._service) * self._step_s(self._decoding)
        self._timer = loop.call_at(self._at + max(wait, 0.0), self._finish, loop)

    def _finish(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._advance(loop.time())
        due = self._due
        # The timer was set for the earliest target (any change since would have
        # moved it): that one is due, whatever the float rounding of the clock.
        if due:
            self._service = max(self._service, due[0][0])
        limit = self._service + _EPS * max(1.0, self._service)
        while due and due[0][0] <= limit:
            _, number, fut = heapq.heappop(due)
            if number in self._left:
                self._left.discard(number)
                continue
            self._decoding -= 1
            _wake(fut)
        self._schedule(loop)
