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


def sync_vs_async_blocks(per_step: int, lookahead: int) -> dict:
    """The ``async_rl`` block of a sync (lookahead 0) or async run that trains
    whole steps: in the sync run training starts once the step's last group is
    in, so nothing overlaps there, and the async run differs in lookahead only."""
    return {
        "sampler": {"name": "in_order", "max_lookahead_versions": lookahead},
        "max_buffered_rollouts": per_step * (lookahead + 1),
        "min_groups_for_streaming_train": per_step,
        "max_inflight_prompts": per_step * (lookahead + 1),
    }
