"""The stall watchdog (``async_rl.stall_watchdog``): no group committed and no
step finished for ``stall_timeout_s``.

It names the side that stalled: the trainer side (a trainer call, the weight
sync, an evaluation or the after-step hook has been running all along) or the
rollout side (the train pump waits for groups that do not come). Then, by
``stall_action``:

* ``warn``: one warning per ``interval_s`` while the stall lasts; the run goes on;
* ``abort``: a rollout-side stall stops the run gracefully (stop reason
  ``stalled``: the train pump stops at once, a checkpoint and the summary are
  written, the resume command printed). A trainer-side stall raises
  :class:`~asyncrl.errors.RolloutStall`: a trainer that does not answer cannot
  be checkpointed.

A stall can also be the event loop itself, blocked by a component that runs
blocking code inside an ``async`` method (an engine's ``generate`` calling
``time.sleep``, a reward doing a blocking request): then no side is at fault
and nothing async runs at all. The watchdog sees that as its own timer firing
late, by at least :func:`blocked_after` seconds, and says so instead of naming
whichever side happened to be busy when the loop came back (``abort`` then
stops gracefully: the loop runs again, so the state can be checkpointed).

It waits on one timer per stall deadline (and one per interval while a stall
lasts), never polls. ``asyncrl simulate`` runs without it: a wall-clock safety
net has no meaning in virtual time, where deadlocks are caught exactly.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from asyncrl.config.failures import StallWatchdogConfig
from asyncrl.controller.context import RunContext
from asyncrl.errors import RolloutStall
from asyncrl.types import StopReason

log = logging.getLogger("asyncrl.controller")

#: ``describe(stalled_for) -> (message, trainer_side)``
Describe = Callable[[float], tuple[str, bool]]


class StallWatchdog:
    def __init__(self, ctx: RunContext, cfg: StallWatchdogConfig, describe: Describe,
                 stop: Callable[[StopReason, str], None]) -> None:
        self.ctx = ctx
        self.cfg = cfg
        self.describe = describe
        self.stop = stop
        #: Warnings logged so far (``warn``).
        self.warnings = 0

    async def run(self) -> None:
        ctx, cfg = self.ctx, self.cfg
        late = 0.0  # how late the last wake-up came: the loop was blocked that long
        while True:
            wait = ctx.last_progress + cfg.stall_timeout_s - ctx.now()
            if wait > 0:
                late = await self._sleep(wait)
                continue
            stalled_for = ctx.now() - ctx.last_progress
            if late >= blocked_after(cfg.stall_timeout_s):
                message, trainer_side = blocked_message(stalled_for, cfg.stall_timeout_s,
                                                        late), False
            else:
                message, trainer_side = self.describe(stalled_for)
            if cfg.stall_action == "warn":
                self.warnings += 1
                log.warning("%s (stall_action: warn: the run goes on)", message)
                late = await self._sleep(cfg.interval_s)
                continue
            if trainer_side:
                raise RolloutStall(message)
            self.stop(StopReason.STALLED, message)
            return


    async def _sleep(self, seconds: float) -> float:
        """Sleep ``seconds``; returns how much later than that the loop woke us."""
        due = self.ctx.now() + seconds
        await asyncio.sleep(seconds)
        return max(0.0, self.ctx.now() - due)


def blocked_after(timeout: float) -> float:
    """Lateness of the watchdog's timer that means the loop was blocked: a busy
    but healthy loop is late by milliseconds, never by a tenth of the timeout
    (and never by a second)."""
    return max(1.0, 0.1 * timeout)


def blocked_message(stalled_for: float, timeout: float, late: float) -> str:
    return (f"no prompt group committed and no training step finished for {stalled_for:.0f}s "
            f"(async_rl.stall_watchdog.stall_timeout_s={timeout:g}): the event loop was "
            f"blocked - the watchdog's own timer fired {late:.0f}s late, so nothing async ran "
            "meanwhile. A component runs blocking code inside an async method (an engine's "
            "generate, a reward, the sampler, a hook: time.sleep, a blocking request, long "
            "CPU work): run that code with asyncio.to_thread or in a process")


def stall_message(stalled_for: float, timeout: float, activity: tuple[str, float],
                  now: float, step: int, waiting_for: str) -> tuple[str, bool]:
    """The watchdog's line, naming the side that stalled (True: the trainer side)."""
    doing, since = activity
    head = (f"no prompt group committed and no training step finished for {stalled_for:.0f}s "
            f"(async_rl.stall_watchdog.stall_timeout_s={timeout:g}). ")
    if doing != "waiting for groups":
        return head + (
            f"The trainer side stalled: {doing} of step {step} has been running for "
            f"{now - since:.0f}s. Check the trainer (for a weight sync or an evaluation, the "
            "engines too), or raise stall_timeout_s for slow steps"), True
    return head + (
        f"The rollout side stalled: the train pump waits for groups of step {step} "
        f"({waiting_for}). Check that the engines are alive and the reward returns, or raise "
        "stall_timeout_s for slow generation"), False


__all__ = ["StallWatchdog", "blocked_after", "blocked_message", "stall_message"]
