"""The serial reference: how long an ideal synchronous run takes for the very
latencies a simulated run drew (the yardstick of the closed-form tests and of
``benchmarks/bench_simulate.py``)."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence

from asyncrl.config import RunConfig
from asyncrl.sim.runner import SimResult, _sim_block


def serial_reference_s(result: SimResult, cfg: RunConfig) -> float:
    """Virtual time an ideal synchronous run needs for the latencies ``result`` drew.

    For on-policy in_order (lookahead 0) a step is: dispatch the step's ``n``
    groups together, train on them as they finish, take the optimizer step,
    sync. With ``c`` = min(rollout_slots, max_inflight_prompts) groups running
    at a time, groups take the first free slot in dispatch order (a FIFO queue
    with ``c`` servers), which gives each group's finish time. Without a
    streaming cost (``train_per_group_s = 0``) the trainer then simply waits
    for the last group (the makespan: the largest latency when ``c >= n``).
    With one, it trains greedily: whenever at least
    ``min(min_groups_for_streaming_train, remaining)`` groups are ready it takes
    all that are, so part of the streaming cost hides behind generation.

    Computed from the very latencies the engine drew, so a controller that
    adds no idle time matches it to floating-point rounding. Exact only without
    failures (a retry's backoff and latency are not modelled here).
    """
    sim = _sim_block(cfg)
    engine = result.engine
    if engine is None:
        raise ValueError("the result does not carry its engine")
    n = cfg.grpo.num_prompts_per_step
    c = min(sim.rollout_slots, cfg.async_rl.max_inflight_prompts)
    min_chunk = cfg.async_rl.min_groups_for_streaming_train
    total = 0.0
    for step in range(result.steps):
        lats = [engine.first_attempt_latency(step * n + i) for i in range(n)]
        finish = _fifo_finish_times(lats, c)
        total += _greedy_train_end(finish, sim.train_per_group_s, min_chunk)
        total += sim.train_step_s + sim.weight_sync_s
    return total


def _fifo_finish_times(latencies: Sequence[float], servers: int) -> list[float]:
    """Sorted finish times of jobs started in order on the first free of ``servers``."""
    if len(latencies) <= servers:
        return sorted(latencies)
    free = [0.0] * servers
    finish = []
    for lat in latencies:
        end = heapq.heappop(free) + lat
        finish.append(end)
        heapq.heappush(free, end)
    return sorted(finish)


def _greedy_train_end(finish: Sequence[float], per_group: float, min_chunk: int) -> float:
    """When the train pump is done with a step's chunks, given sorted finish times."""
    n = len(finish)
    t, taken = 0.0, 0
    while taken < n:
        need = min(min_chunk, n - taken)
        t = max(t, finish[taken + need - 1])
        ready = bisect.bisect_right(finish, t, lo=taken) - taken
        t += per_group * ready
        taken += ready
    return t
