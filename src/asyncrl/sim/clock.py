"""Virtual time: run the unmodified controller on a loop whose clock jumps.

``loop.time()`` is virtual, and when nothing is ready to run the clock jumps
straight to the next timer. No wall-clock sleep happens anywhere. If the loop
goes idle with no timer pending (every task waits on something that can never
happen), that is a deadlock: the tasks get an ``IdleTimeoutError`` instead of
the process hanging.

Two loops provide this:

* ``"looptime"``: `looptime`'s event loop (time on an integer microsecond grid).
* ``"jump"`` (:class:`JumpClockLoop`): a small asyncio loop of our own for the
  simulator's hot path. looptime polls the real selector, walks its executor
  futures and spends a no-op cycle before every jump of the clock; at tens of
  thousands of timers per simulated run that bookkeeping was half the wall
  time of ``asyncrl simulate``. The jump loop moves the clock exactly to the
  next timer in the same iteration and touches the real selector only when
  the loop is idle. Timers fire at their exact float time (looptime rounds to
  microseconds), so the two loops agree to within a microsecond per timer.
"""

from __future__ import annotations

import asyncio
import heapq
import selectors
from asyncio import base_events
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

LoopKind = Literal["looptime", "jump"]


def _idle_timeout_error() -> type[BaseException]:
    try:
        import looptime

        return looptime.IdleTimeoutError
    except ImportError:  # pragma: no cover - looptime is a dependency
        return asyncio.TimeoutError


class _JumpSelector(selectors.DefaultSelector):
    """The loop's selector: a zero or positive timeout moves the virtual clock
    instead of waiting; only an idle loop (timeout None) looks at real I/O.

    :meth:`JumpClockLoop._run_once` bypasses it except when idle; it serves the
    stock ``_run_once`` in asyncio debug mode.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop: JumpClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[Any, Any]]:
        loop = self.loop
        if loop is None:  # pragma: no cover - set right after construction
            return super().select(timeout)
        if timeout is None:
            return loop._idle(self.real_select)
        if timeout > 0:
            loop._jump(timeout)
        return []

    def real_select(self, timeout: float | None = None) -> list[tuple[Any, Any]]:
        return super().select(timeout)


class JumpClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time that jumps to the next timer at once.

    Real I/O (the loop's self-pipe, executor threads) is looked at only when
    no callback is ready and no timer is pending. Virtual time does not wait
    for a thread in an executor: while timers are pending the clock jumps on;
    once every task waits for the thread, the loop blocks until it is done,
    with the clock standing still.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        self._executor_futures: set[asyncio.Future[Any]] = set()
        selector = _JumpSelector()
        super().__init__(selector)
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
        future = super().run_in_executor(executor, func, *args)
        self._executor_futures.add(future)
        future.add_done_callback(self._executor_futures.discard)
        return future

    def _run_once(self) -> None:
        """One iteration of asyncio's ``BaseEventLoop._run_once``, minus the I/O poll.

        The same steps in the same order (drop cancelled timers, move the
        clock, make due timers ready, run the callbacks that were ready), so
        callbacks run in exactly the order the stock loop would run them; only
        the ``select`` call and the debug bookkeeping of a busy iteration are
        skipped. Debug mode keeps the stock implementation.
        """
        if self._debug:
            super()._run_once()
            return
        scheduled = self._scheduled
        count = len(scheduled)
        if (count > base_events._MIN_SCHEDULED_TIMER_HANDLES and self._timer_cancelled_count / count
                > base_events._MIN_CANCELLED_TIMER_HANDLES_FRACTION):
            live = []
            for handle in scheduled:
                if handle._cancelled:
                    handle._scheduled = False
                else:
                    live.append(handle)
            heapq.heapify(live)
            self._scheduled = scheduled = live
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)._scheduled = False

        ready = self._ready
        if not ready and not self._stopping:
            if scheduled:
                when = scheduled[0]._when
                if when > self._virtual_now:
                    self._virtual_now = when
            else:
                self._process_events(self._idle(self._selector.real_select))

        end_time = self._virtual_now + self._clock_resolution
        while scheduled and scheduled[0]._when < end_time:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)

        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if not handle._cancelled:
                handle._run()
        handle = None  # break a reference cycle if the callback raised, as asyncio does

    def _jump(self, timeout: float) -> None:
        now = self._virtual_now
        scheduled = self._scheduled  # the heap of timers; its head is the next one due
        target = scheduled[0]._when if scheduled else now + timeout
        # Land exactly on the timer's own float time, so it is due in this very
        # iteration; only asyncio's one-day clamp can make the jump shorter.
        if target - now > timeout:
            target = now + timeout
        if target > now:
            self._virtual_now = target

    def _idle(self, real_select: Any) -> list[tuple[Any, Any]]:
        if self._executor_futures:
            return real_select(None)
        events = real_select(0)
        if events:
            return events
        error = _idle_timeout_error()
        message = (
            "virtual time deadlock: every task is waiting, and no timer or I/O can wake "
            "any of them"
        )
        for task in asyncio.all_tasks(self):
            waiter = getattr(task, "_fut_waiter", None)
            if waiter is not None and not waiter.done():
                waiter.set_exception(error(message))
            else:
                task.cancel(message)
        return []


def new_virtual_loop(kind: LoopKind = "looptime", *, start: float = 0.0) -> asyncio.AbstractEventLoop:
    if kind == "jump":
        return JumpClockLoop(start)
    if kind == "looptime":
        import looptime

        return looptime.new_event_loop(start=start, noop_cycles=0, idle_timeout=0)
    raise ValueError(f"unknown virtual loop {kind!r}; use 'looptime' or 'jump'")


def run_virtual(
    coro: Coroutine[Any, Any, T], *, start: float = 0.0, loop: LoopKind = "looptime"
) -> T:
    """Run ``coro`` to completion under virtual time and return its result."""
    ev = new_virtual_loop(loop, start=start)
    try:
        return ev.run_until_complete(coro)
    finally:
        try:
            ev.run_until_complete(ev.shutdown_asyncgens())
        finally:
            ev.close()
