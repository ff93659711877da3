"""Virtual time in tests: let time pass, or let everything that can run, run.

``advance(seconds)`` and ``settle()`` refuse to run on a real event loop, so a
test can never sleep in real time by accident: under ``run_virtual`` the clock
jumps at once. ``@virtual`` runs an ``async def`` test on the jump loop.
``advance`` is the suite's one sleep with a delay (tests/test_suite_hygiene.py
refuses any other): the fakes' latencies go through it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from asyncrl.sim.clock import JumpClockLoop, run_virtual


def _is_virtual(loop: asyncio.AbstractEventLoop) -> bool:
    import looptime

    return isinstance(loop, (JumpClockLoop, looptime.LoopTimeEventLoop))


async def advance(seconds: float) -> None:
    """Let ``seconds`` of *virtual* time pass. ``advance(0)`` only yields to the
    loop, so it runs on a real loop too (a fake with no latency, in a benchmark)."""
    # advance(0) asks nothing of the loop: the zero-latency fakes of the
    # controller benchmark call it once per group.
    if seconds and not _is_virtual(asyncio.get_running_loop()):
        raise RuntimeError("advance() only runs under asyncrl.sim.clock.run_virtual")
    await asyncio.sleep(seconds)


async def settle() -> None:
    """Return once every other task is blocked: all that can happen at this
    instant of virtual time has happened (the clock does not move)."""
    loop = asyncio.get_running_loop()
    if not isinstance(loop, JumpClockLoop):
        raise RuntimeError("settle() runs on the jump loop: decorate the test with @virtual")
    await loop.settled()


def virtual(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an ``async def`` test under virtual time on the jump loop."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        run_virtual(test(*args, **kwargs), loop="jump")

    return run
