"""Virtual time: run the unmodified controller on a loop whose clock jumps.

``loop.time()`` is virtual, and when nothing is ready to run the clock jumps
straight to the next timer. No wall-clock sleep happens anywhere. If the loop
goes idle with no timer pending (every task waits on something that can never
happen), that is a deadlock: the run fails with an ``IdleTimeoutError``
instead of the process hanging.

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
import math
import selectors
import time
from asyncio import format_helpers
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
    """The loop's selector, where virtual time moves.

    asyncio's loop asks its selector to wait ``timeout`` seconds for I/O when
    nothing is ready: exactly until the next timer is due. Here that wait
    moves the virtual clock by ``timeout`` and returns at once; only an idle
    loop (``timeout`` None: no callback ready, no timer pending) looks at real
    I/O, and only to wait for executor threads.
    """

    def __init__(self) -> None:
        super().__init__()
        self.loop: JumpClockLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[Any, Any]]:
        loop = self.loop
        if loop is None:  # pragma: no cover - set right after construction
            return super().select(timeout)
        if timeout is not None and timeout <= 0:
            return []  # callbacks are ready: run them, the clock stands still
        if loop._wake_settled():
            return []  # every task is blocked: those waiting for that go on first
        if timeout is None:
            return loop._idle(super().select)
        grace = loop._thread_grace()
        if grace > 0:
            # A thread started moments ago may be about to finish: give it that
            # long in real time, with the clock standing still.
            return super().select(grace)
        loop._advance(timeout)
        return []


class JumpClockLoop(asyncio.SelectorEventLoop):
    """An asyncio loop on virtual time that jumps to the next timer at once.

    ``time()`` returns the virtual clock, and the selector (see
    :class:`_JumpSelector`) advances it instead of waiting; on the hot path
    the loop's pass (:meth:`_run_once`) moves the clock itself and skips the
    selector. Real I/O (the loop's self-pipe, executor threads) is
    looked at only when no callback is ready. A thread in an executor holds the
    clock for at most :attr:`THREAD_GRACE_S` real seconds (quick work takes no
    virtual time); after that, while timers are pending, the clock jumps on,
    and once every task waits for the thread, the loop blocks until it is done.
    """

    #: Real seconds an executor thread may run while the virtual clock waits for
    #: it. Quick work in a thread (a reward, a tokenizer) then takes no virtual
    #: time; a thread that is still busy after this (a hung call) no longer holds
    #: the clock, so virtual timeouts for it fire.
    THREAD_GRACE_S = 0.25

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        #: asyncio's clock resolution (its __init__ sets it again, to the same).
        self._base_resolution = time.get_clock_info("monotonic").resolution
        #: Executor futures still running, with the real time each started.
        self._executor_futures: dict[asyncio.Future[Any], float] = {}
        self._settle_waiters: list[asyncio.Future[None]] = []
        selector = _JumpSelector()
        super().__init__(selector)
        selector.loop = self
        #: Whether :meth:`_run_once` may take its lean path (see there).
        self._lean = _LEAN_HANDLES and all(hasattr(self, name) for name in _LOOP_PARTS)

    def time(self) -> float:
        return self._virtual_now

    @property
    def _clock_resolution(self) -> float:
        """How close to now a timer counts as due (asyncio's pass reads it):
        the monotonic clock's resolution, or one float step where the virtual
        clock has grown past it (from 2**24 s on, ``now + 1e-9 == now``, and a
        timer due exactly now was never run: the loop spun)."""
        now = self._virtual_now
        return max(self._base_resolution, math.ulp(now))

    @_clock_resolution.setter
    def _clock_resolution(self, value: float) -> None:  # asyncio's __init__ sets it
        self._base_resolution = value

    def _run_once(self) -> None:
        """One pass of the loop: the same steps as asyncio's, without the
        selector round trip when no real I/O can matter.

        asyncio's pass asks the selector to wait until the next timer, which
        here only moves the clock; at hundreds of passes per simulated step
        that round trip (and the general pass's bookkeeping) was a tenth of the
        simulator's time. While no executor thread runs, no test waits for
        :meth:`settled`, and the loop is neither stopping, in debug mode nor
        due to rebuild its timer heap, this pass does what asyncio's would, in
        the same order: drop cancelled timers at the heap's head, jump the clock
        to the next timer when no callback is ready (by at most asyncio's
        longest wait), move the due timers to the ready queue and run the
        callbacks that were ready (a callback that raises goes to the loop's
        exception handler, as asyncio's would). Everything else goes to
        asyncio's pass.
        ``tests/sim/test_clock.py`` runs simulations, and a scenario that takes
        each path handed to asyncio, both ways: the same to the last float. (It reads the loop's private queues; where they are not as
        asyncio 3.10-3.13 keeps them, ``_lean`` is False and asyncio's pass runs.)
        """
        ready, scheduled = self._ready, self._scheduled  # type: ignore[attr-defined]
        cancelled = self._timer_cancelled_count  # type: ignore[attr-defined]
        if (not self._lean or self._stopping or self._debug  # type: ignore[attr-defined]
                or self._executor_futures
                or (cancelled and len(scheduled) > _REBUILD_AT
                    and cancelled / len(scheduled) > _REBUILD_FRACTION)):
            super()._run_once()  # type: ignore[misc]
            return
        while scheduled and scheduled[0]._cancelled:
            self._timer_cancelled_count -= 1  # type: ignore[attr-defined]
            heapq.heappop(scheduled)._scheduled = False
        if not ready:
            if not scheduled or self._settle_waiters:
                super()._run_once()  # type: ignore[misc]  # idle, or settle() waits
                return
            # What the selector's wait would do: the clock jumps to the timer.
            self._virtual_now += min(max(0.0, scheduled[0]._when - self._virtual_now),
                                     _MAX_WAIT_S)
        now = self._virtual_now
        end = now + self._base_resolution
        if end <= now:  # past 2**24 s the resolution is below a float step
            end = math.nextafter(now, math.inf)
        while scheduled and scheduled[0]._when < end:
            handle = heapq.heappop(scheduled)
            handle._scheduled = False
            ready.append(handle)
        popleft = ready.popleft
        for _ in range(len(ready)):
            handle = popleft()
            if handle._cancelled:
                continue
            # Handle._run's body, without its call (one per callback).
            try:
                handle._context.run(handle._callback, *handle._args)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                self._report(handle, exc)

    def _report(self, handle: asyncio.Handle, exc: BaseException) -> None:
        """What Handle._run reports when its callback raises, word for word."""
        source = format_helpers._format_callback_source(
            handle._callback, handle._args)  # type: ignore[attr-defined]
        context = {"message": f"Exception in callback {source}", "exception": exc,
                   "handle": handle}
        if handle._source_traceback:  # type: ignore[attr-defined]
            context["source_traceback"] = handle._source_traceback  # type: ignore[attr-defined]
        self.call_exception_handler(context)

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> asyncio.Handle:
        """asyncio's ``call_soon`` in one frame on the lean path (see
        :meth:`_run_once`): every future and task wake-up comes through here,
        several per simulated group, and asyncio's spends two more calls on
        checks that hold (not closed; debug mode goes to asyncio's)."""
        if not self._lean or self._debug or self._closed:  # type: ignore[attr-defined]
            return super().call_soon(callback, *args, context=context)
        handle = asyncio.Handle(callback, args, self, context)
        self._ready.append(handle)  # type: ignore[attr-defined]
        return handle

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:
        future = super().run_in_executor(executor, func, *args)
        self._executor_futures[future] = time.monotonic()
        future.add_done_callback(self._executor_futures.pop)
        return future

    def _thread_grace(self) -> float:
        """Real seconds to keep waiting for the youngest running executor thread
        (0 when none started within :attr:`THREAD_GRACE_S`)."""
        if not self._executor_futures:
            return 0.0
        youngest = max(self._executor_futures.values())
        return max(0.0, youngest + self.THREAD_GRACE_S - time.monotonic())

    def settled(self) -> asyncio.Future[None]:
        """A future that completes once every task is blocked (no callback is
        ready), before the clock moves on: "everything that can happen at this
        instant has happened". Tests use it instead of counting ``sleep(0)``."""
        future = self.create_future()
        self._settle_waiters.append(future)
        return future

    def _wake_settled(self) -> bool:
        waiters, self._settle_waiters = self._settle_waiters, []
        for future in waiters:
            if not future.done():
                future.set_result(None)
        return bool(waiters)

    def _advance(self, seconds: float) -> None:
        self._virtual_now += seconds

    def _idle(self, real_select: Any) -> list[tuple[Any, Any]]:
        """Nothing is ready and no timer is pending: wait for executor threads,
        or report the deadlock (no task can ever be woken)."""
        if self._executor_futures:
            return real_select(None)
        events = real_select(0)
        if events:
            return events
        raise _idle_timeout_error()(
            "virtual time deadlock: every task is waiting, and no timer or I/O can wake any of "
            "them"
        )


def _timer_handles_have_lean_parts() -> bool:
    """Whether asyncio's timer handles keep the fields :meth:`JumpClockLoop._run_once`
    reads (3.10-3.13 do)."""
    slots = {*asyncio.Handle.__slots__, *asyncio.TimerHandle.__slots__}
    return ({"_when", "_cancelled", "_scheduled", "_context", "_callback", "_args",
             "_source_traceback"} <= slots
            and hasattr(format_helpers, "_format_callback_source"))


#: asyncio's own constants for the same steps (base_events: its longest
#: selector wait, and when a pass rebuilds the timer heap).
_MAX_WAIT_S = 24 * 3600.0
_REBUILD_AT = 100
_REBUILD_FRACTION = 0.5
_LEAN_HANDLES = _timer_handles_have_lean_parts()
#: The loop's own fields the lean path reads, checked on each loop made.
_LOOP_PARTS = ("_ready", "_scheduled", "_timer_cancelled_count", "_stopping", "_debug",
               "_closed")


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
