"""``checkpoint.save_by``: stop with a checkpoint before a wall-clock deadline.

Before each step the run asks :meth:`SaveBy.must_stop` whether one more step
and a checkpoint still end before the deadline; when they do not, it stops
gracefully (the path of a first SIGTERM: a final checkpoint, the summary, the
resume hint) and ``asyncrl train`` exits with :data:`EXIT_CODE`, which a job
script tests to requeue itself.

The prediction is deliberately pessimistic: the longest of the last few steps
(the first one includes the engines' warm-up) plus the last checkpoint's
capture and write (before the first: one step's time). The clock is injected,
so tests drive it by hand or run it in virtual time.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path

#: Exit code of a run that stopped for its ``save_by`` deadline: sysexits.h's
#: EX_TEMPFAIL ("a temporary failure; the user is invited to retry").
EXIT_CODE = 75
#: Steps whose time the prediction looks at (the longest of them counts).
WINDOW = 4


def process_age_s() -> float:
    """Seconds since this process started (the kernel's start time, so the
    interpreter's start-up and the imports count too)."""
    try:
        import psutil

        return max(0.0, time.time() - psutil.Process().create_time())
    except (ImportError, OSError):  # pragma: no cover - psutil is a dependency of ray/vllm
        return max(0.0, _proc_age_s())


def _proc_age_s() -> float:  # pragma: no cover - the fallback above
    import os

    ticks = os.sysconf("SC_CLK_TCK")
    start = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19]) / ticks
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return uptime - start


class SaveBy:
    """The deadline ``limit_s`` after ``started_at`` (both on ``clock``'s scale)."""

    def __init__(self, limit_s: float, *, clock: Callable[[], float] = time.monotonic,
                 started_at: float | None = None) -> None:
        self.clock = clock
        now = clock()
        self.at = (now - process_age_s() if started_at is None else started_at) + limit_s
        self.limit_s = limit_s
        self._last_mark = now
        self._steps: collections.deque[float] = collections.deque(maxlen=WINDOW)
        #: Seconds the last checkpoint took to capture and write (None: none yet).
        self.checkpoint_s: float | None = None
        #: Start-up's length when it outlasted the deadline (None: it did not).
        self.startup_s: float | None = None

    def step_done(self) -> None:
        """A step ended (the time since the previous mark is its duration)."""
        now = self.clock()
        self._steps.append(now - self._last_mark)
        self._last_mark = now

    def checkpoint_took(self, seconds: float) -> None:
        self.checkpoint_s = seconds

    def predicted_s(self) -> float:
        """How long one more step and its checkpoint are expected to take."""
        step = max(self._steps, default=0.0)
        return step + (self.checkpoint_s if self.checkpoint_s is not None else step)

    def must_stop(self) -> bool:
        """True when one more step and a checkpoint would end after the deadline."""
        return self.clock() + self.predicted_s() > self.at

    def note_start(self) -> None:
        """Called once, before the first step: remembers a deadline that start-up
        (the process, imports, model, engines) already used up, so the stop
        after that step says so instead of "0s left". The step still runs: each
        requeued job then makes a step of progress, and the message says to raise
        ``save_by``."""
        now = self.clock()
        if now >= self.at:
            self.startup_s = now - (self.at - self.limit_s)

    def message(self, version: int) -> str:
        if self.startup_s is not None:
            return (f"checkpoint.save_by deadline: it allows {self.limit_s:.0f}s, but start-up "
                    f"took {self.startup_s:.0f}s: the deadline had passed before the first step; "
                    f"stopped after step {version} with a checkpoint (exit code {EXIT_CODE}). "
                    "Raise checkpoint.save_by well above the start-up time")
        left = self.at - self.clock()
        return (f"checkpoint.save_by deadline: {max(left, 0.0):.0f}s left, and one more step "
                f"with its checkpoint takes about {self.predicted_s():.0f}s; stopped after "
                f"step {version} with a checkpoint (exit code {EXIT_CODE})")


__all__ = ["EXIT_CODE", "SaveBy", "process_age_s"]
