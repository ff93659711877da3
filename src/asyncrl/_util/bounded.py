"""Lists of per-step or per-event records that a long run keeps in memory.

A run of 10^6 steps must not hold 10^6 of anything: such lists keep their
newest :data:`KEEP` items (the full history goes to files: metrics.jsonl,
ledger.jsonl, timeline.json).
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")

#: Items a bounded record list keeps.
KEEP = 1000


def append_bounded(items: list[T], item: T, keep: int = KEEP) -> None:
    """Append ``item``, dropping the oldest items beyond ``keep`` (in batches, so
    the cost per append stays constant)."""
    items.append(item)
    if len(items) >= 2 * keep:
        del items[:-keep]


__all__ = ["KEEP", "append_bounded"]
