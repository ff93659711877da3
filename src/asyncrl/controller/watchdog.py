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
        while True:
            wait = ctx.last_progress + cfg.stall_timeout_s - ctx.now()
            if wait > 0:
                await asyncio.sleep(wait)
                continue
            message, trainer_side = self.describe(ctx.now() - ctx.last_progress)
            if cfg.stall_action == "warn":
                self.warnings += 1
                log.warning("%s (stall_action: warn: the run goes on)", message)
                await asyncio.sleep(cfg.interval_s)
                continue
            if trainer_side:
                raise RolloutStall(message)
            self.stop(StopReason.STALLED, message)
            return


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


__all__ = ["StallWatchdog", "stall_message"]
