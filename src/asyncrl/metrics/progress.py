"""Progress of a training run, as metrics sinks: a live bar on a terminal, and
one-line records for logs (output redirected to a file, cluster jobs).

``logging.progress`` picks (see :func:`progress_sink`): ``auto`` and ``always``
show the bar when stderr is a terminal and the lines otherwise, ``lines`` the
lines even on a terminal, ``never`` nothing.
"""

from __future__ import annotations

import math
import sys
from typing import Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

#: Steps after this process's first that the ETA waits for (see :class:`Eta`).
ETA_AFTER_STEPS = 2


class Eta:
    """Seconds left in a run, from the pace of the steps after this process's
    first one, on the run's clock (the records' ``wall_time_s``).

    The first step carries the warm-up - vLLM compiles and captures graphs,
    allocators grow, the first batches are cold - and can take longer than the
    rest of the run: a rate that included it once read 18m47s for a run that
    took 1m21s. So the clock starts at the end of the first step, and there is
    no ETA (NaN) until :data:`ETA_AFTER_STEPS` steps after it are done."""

    def __init__(self, total_steps: int) -> None:
        self.total = total_steps
        self._first: tuple[int, float] | None = None  # (steps done, time) after the first step

    def update(self, done: int, now: float) -> float:
        """``done`` steps of the run are done at run time ``now``: the seconds left."""
        if self._first is None:
            self._first = (done, now)
        first_done, first_end = self._first
        steps, seconds = done - first_done, now - first_end
        if steps < ETA_AFTER_STEPS or seconds <= 0:
            return math.nan
        return (self.total - done) * seconds / steps


class ProgressSink:
    """One bar: step / max steps, reward, staleness, groups/s and ETA."""

    def __init__(self, total_steps: int, *, start_step: int = 0, console: Console | None = None,
                 description: str = "train") -> None:
        self.console = console or Console(file=sys.stderr)
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("step {task.completed:>4.0f}/{task.total:.0f}"),
            TextColumn("reward {task.fields[reward]}"),
            TextColumn("staleness {task.fields[staleness]}"),
            TextColumn("{task.fields[rate]} groups/s"),
            TimeElapsedColumn(),
            TextColumn("eta {task.fields[eta]}"),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task(
            description, total=total_steps, completed=start_step,
            reward="  -  ", staleness=" - ", rate=" - ", eta="-",
        )
        self._progress.start()
        self._groups = 0
        self._eta = Eta(total_steps)

    def write(self, record: dict[str, Any]) -> None:
        reward = record.get("reward_mean", math.nan)
        elapsed = max(float(record.get("wall_time_s", 0.0)), 1e-9)
        self._groups += int(record.get("groups_trained", 0))
        done = int(record["step"]) + 1
        self._progress.update(
            self._task,
            completed=done,
            reward=f"{reward:.3f}" if reward == reward else "  -  ",
            staleness=f"{record.get('staleness_mean', 0.0):.2f}",
            rate=f"{self._groups / elapsed:.1f}",
            eta=_duration(self._eta.update(done, elapsed)),
        )

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self._progress.stop()


class ProgressLines:
    """One line every ``every_s`` seconds of the run (and at the first and last
    step): step, reward, staleness, groups/s and ETA (:class:`Eta`), flushed at once, e.g.::

        asyncrl train: step 120/500 (24%)  reward 0.812  staleness 1.00  12.3 groups/s  elapsed 35s  eta 1m50s
    """

    def __init__(self, total_steps: int, *, start_step: int = 0, every_s: float = 30.0,
                 stream: TextIO | None = None, label: str = "asyncrl train") -> None:
        self.total = total_steps
        self.start = start_step
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stderr
        self.label = label
        self._t0: float | None = None  # run time when this process's first step began
        self._last: float | None = None
        self._groups = 0
        self._eta = Eta(total_steps)

    def write(self, record: dict[str, Any]) -> None:
        now = float(record.get("wall_time_s") or 0.0)
        if self._t0 is None:
            self._t0 = now - float(record.get("step_time_s") or 0.0)
        self._groups += int(record.get("groups_trained") or 0)
        done = int(record["step"]) + 1
        eta = self._eta.update(done, now)  # every step: the pace needs each one
        due = self._last is None or now - self._last >= self.every_s or done >= self.total
        if not due:
            return
        self._last = now
        self.stream.write(self.line(record, done, now, eta) + "\n")
        self.stream.flush()

    def line(self, record: dict[str, Any], done: int, now: float, eta: float) -> str:
        elapsed = max(now - (self._t0 or 0.0), 1e-9)
        reward = record.get("reward_mean")
        staleness = record.get("staleness_mean")
        return (
            f"{self.label}: step {done}/{self.total} ({100 * done / max(self.total, 1):.0f}%)  "
            f"reward {_num(reward, 3)}  staleness {_num(staleness, 2)}  "
            f"{self._groups / elapsed:.1f} groups/s  elapsed {_duration(elapsed)}  "
            f"eta {_duration(eta)}"
        )

    def close(self, summary: dict[str, Any] | None = None) -> None:
        return None


def _num(value: Any, digits: int) -> str:
    if value is None or not math.isfinite(float(value)):
        return "-"
    return f"{float(value):.{digits}f}"


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    whole = round(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def progress_sink(mode: str, total_steps: int, *, start_step: int = 0, every_s: float = 30.0,
                  stream: TextIO | None = None) -> ProgressSink | ProgressLines | None:
    """The progress sink ``logging.progress`` asks for on this ``stream`` (stderr)."""
    stream = stream if stream is not None else sys.stderr
    if mode == "never":
        return None
    if mode != "lines" and stream.isatty():
        return ProgressSink(total_steps, start_step=start_step, console=Console(file=stream))
    # Not a terminal (a log file, a cluster job): a live bar would print nothing
    # until the end, so print a line now and then instead.
    return ProgressLines(total_steps, start_step=start_step, every_s=every_s, stream=stream)
