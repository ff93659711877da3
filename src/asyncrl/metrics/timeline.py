"""Activity intervals of the two pumps, for the pump-timeline plots."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload


class Interval(NamedTuple):
    """One busy interval of an engine or the trainer."""

    #: "gen" (a generation attempt), or on the trainer's lane every interval it is
    #: busy: "train" (a chunk's forward/backward), "step" (the optimizer step),
    #: "sync" (the weight sync to the engines).
    kind: str
    lane: int  # engine index for "gen"; 0 for the trainer
    start: float
    end: float
    label: str = ""  # outcome for "gen" (committed/failed/aborted/retry), step for train


#: A stored row as an :class:`Interval`, made in C (``Interval._make`` is a
#: Python call per row; a long run reads back ~10^5 rows). Rows are 5-tuples.
_as_interval = functools.partial(tuple.__new__, Interval)


class Timeline:
    """The run's busy intervals, in the order they ended.

    Stored as plain tuples of atomic values, which the garbage collector stops
    tracking after its first pass: a long run keeps up to ``max_intervals`` of
    them, and a tracked object each (an ``Interval`` is a tuple subclass, which
    the collector keeps tracking) would lengthen every full pass over the heap.
    ``intervals`` reads them back as :class:`Interval`.
    """

    def __init__(self, *, max_intervals: int = 500_000) -> None:
        self._rows: list[tuple[str, int, float, float, str]] = []
        self._max = max_intervals

    @property
    def intervals(self) -> Sequence[Interval]:
        """The intervals so far (a live view: it grows as the run goes on)."""
        return _Intervals(self._rows)

    def add(self, kind: str, lane: int, start: float, end: float, label: str = "") -> None:
        # A hard cap keeps very long runs from growing without bound; the plots
        # only need the shape.
        if len(self._rows) < self._max:
            self._rows.append((kind, lane, start, end, label))

    def to_list(self) -> list[dict[str, Any]]:
        return [
            {"kind": i.kind, "lane": i.lane, "start": i.start, "end": i.end, "label": i.label}
            for i in self.intervals
        ]


class _Intervals(Sequence[Interval]):
    """A read-only view of a timeline's rows as :class:`Interval` values."""

    __slots__ = ("_rows",)

    def __init__(self, rows: list[tuple[str, int, float, float, str]]) -> None:
        self._rows = rows

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> Interval: ...
    @overload
    def __getitem__(self, index: slice) -> list[Interval]: ...
    def __getitem__(self, index: int | slice) -> Interval | list[Interval]:
        if isinstance(index, slice):
            return list(map(_as_interval, self._rows[index]))
        return _as_interval(self._rows[index])

    def __iter__(self) -> Iterator[Interval]:
        return map(_as_interval, self._rows)

    def __reversed__(self) -> Iterator[Interval]:
        return map(_as_interval, reversed(self._rows))
