"""Live progress display of a training run (rich), as a metrics sink."""

from __future__ import annotations

import math
import sys
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


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
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task(
            description, total=total_steps, completed=start_step,
            reward="  -  ", staleness=" - ", rate=" - ",
        )
        self._progress.start()
        self._groups = 0

    def write(self, record: dict[str, Any]) -> None:
        reward = record.get("reward_mean", math.nan)
        elapsed = max(float(record.get("wall_time_s", 0.0)), 1e-9)
        self._groups += int(record.get("groups_trained", 0))
        self._progress.update(
            self._task,
            completed=int(record["step"]) + 1,
            reward=f"{reward:.3f}" if reward == reward else "  -  ",
            staleness=f"{record.get('staleness_mean', 0.0):.2f}",
            rate=f"{self._groups / elapsed:.1f}",
        )

    def close(self, summary: dict[str, Any] | None = None) -> None:
        self._progress.stop()
