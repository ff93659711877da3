"""Letting virtual time pass in tests.

``advance(seconds)`` refuses to run on a real event loop, so a test can never
sleep in real time by accident: under ``run_virtual`` the clock jumps at once.
"""

from __future__ import annotations

import asyncio


def _is_virtual(loop: asyncio.AbstractEventLoop) -> bool:
    import looptime

    from asyncrl.sim.clock import JumpClockLoop

    return isinstance(loop, (JumpClockLoop, looptime.LoopTimeEventLoop))


async def advance(seconds: float) -> None:
    """Let ``seconds`` of *virtual* time pass."""
    loop = asyncio.get_running_loop()
    if not _is_virtual(loop):
        raise RuntimeError("advance() only runs under asyncrl.sim.clock.run_virtual")
    await asyncio.sleep(seconds)
