"""Virtual time: run the unmodified controller on a loop whose clock jumps.

We use `looptime`'s event loop: ``loop.time()`` is virtual, and when nothing is
ready to run the clock jumps straight to the next timer. No wall-clock sleep
happens anywhere. If the loop goes idle with no timer pending (every task waits
on something that can never happen), that is a deadlock: the tasks get
``looptime.IdleTimeoutError`` instead of the process hanging.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_virtual(coro: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``coro`` to completion under virtual time and return its result."""
    import looptime

    loop = looptime.new_event_loop(start=start, noop_cycles=0, idle_timeout=0)
    try:
        return loop.run_until_complete(coro)
    finally:
        try:
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()
