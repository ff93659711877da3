"""Activity intervals of the two pumps, for the pump-timeline plots."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class Interval:
    #: "gen" (a generation attempt), or on the trainer's lane every interval it is
    #: busy: "train" (a chunk's forward/backward), "step" (the optimizer step),
    #: "sync" (the weight sync to the engines).
    kind: str
    lane: int  # engine index for "gen"; 0 for the trainer
    start: float
    end: float
    label: str = ""  # outcome for "gen" (committed/failed/aborted/retry), step for train


class Timeline:
    def __init__(self, *, max_intervals: int = 500_000) -> None:
        self.intervals: list[Interval] = []
        self._max = max_intervals

    def add(self, kind: str, lane: int, start: float, end: float, label: str = "") -> None:
        # A hard cap keeps very long runs from growing without bound; the plots
        # only need the shape.
        if len(self.intervals) < self._max:
            self.intervals.append(Interval(kind, lane, start, end, label))

    def to_list(self) -> list[dict[str, Any]]:
        return [
            {"kind": i.kind, "lane": i.lane, "start": i.start, "end": i.end, "label": i.label}
            for i in self.intervals
        ]
