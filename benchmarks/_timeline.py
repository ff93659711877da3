"""Reading a run's ``timeline.json`` in benchmarks."""

from __future__ import annotations


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals: how long at least one
    of them was running (overlapping groups in flight count once)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total
