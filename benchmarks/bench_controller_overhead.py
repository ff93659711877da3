"""Groups per second through the whole controller loop, on one core.

Zero-latency fake engine and trainer, ``num_prompts_per_step=64``, streaming
(``min_groups_for_streaming_train=1``), windowed sampler with a window wide
enough that nothing is evicted, so the buffer stays full at its capacity. The
reference measured in the same run is the same loop at capacity 10^2: the
per-step controller cost must not grow with capacity (10^4 vs 10^2). Both are
measured over 300 steps of steady state, from the step at which the buffer is
full (at 10^4 the rollout pump needs ~150 steps to fill it). The fake trainer
keeps nothing it trained, as a real one: the heap holds what the controller
holds. Target: >= 25,000 groups/s at 10^4 on a quiet machine, per-step cost
ratio <= 1.2 (issue 33). Last line: ``RESULT controller_groups_per_s <value>``
(the slower capacity).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller import Controller

PER_STEP = 64
MEASURED = 300  # steady-state steps measured per run


def run(capacity: int, steps: int) -> tuple[float, float]:
    task = FakeTask()
    ctl = Controller(
        task=task, engines=[FakeEngine(0.0)], trainer=FakeTrainer(step_time=0.0, keep_chunks=False),
        grpo=GRPOConfig(num_prompts_per_step=PER_STEP, num_generations_per_prompt=1,
                        max_num_steps=steps),
        async_rl=AsyncRLConfig(
            sampler={"name": "windowed", "max_staleness_versions": 10**9},
            max_buffered_rollouts=capacity, min_groups_for_streaming_train=1,
            max_inflight_prompts=capacity),
        # Scoring inline: this measures the controller; benchmarks/bench_reward_pool.py
        # measures what the reward worker pool adds.
        scorer=InlineScorer(task),
    )
    result = asyncio.run(ctl.run())
    assert result.summary["ledger"]["balanced"]
    # Steady state: skip the warm-up during which the rollout pump fills the
    # buffer to its capacity (those groups are dispatched, not trained). It
    # fills by about one step's groups per step, so at capacity 10^4 that takes
    # ~150 steps: the measured steps start where the buffer is full.
    records = ctl.step_records
    warm = next((max(i, 1) for i, r in enumerate(records)
                 if r["buffer_ready"] + r["inflight"] >= capacity), None)
    if warm is None or warm + MEASURED > len(records):
        raise SystemExit(f"capacity {capacity}: the buffer filled at step {warm}, leaving "
                         f"fewer than {MEASURED} steady steps of {steps}; raise the steps")
    part = records[warm:warm + MEASURED]
    elapsed = part[-1]["wall_time_s"] - records[warm - 1]["wall_time_s"]
    trained = sum(r["groups_trained"] for r in part)
    return trained / elapsed, elapsed / MEASURED * 1e3


def main() -> None:
    rows = []
    for capacity, steps in ((100, 400), (10_000, 600)):
        best = max((run(capacity, steps) for _ in range(3)), key=lambda r: r[0])
        rows.append((capacity, *best))
    print(f"{'capacity':>10}{'groups/s':>12}{'ms/step':>10}")
    for capacity, gps, ms in rows:
        print(f"{capacity:>10}{gps:>12.0f}{ms:>10.3f}")
    growth = rows[1][2] / rows[0][2]
    print(f"per-step cost at 1e4 / 1e2 capacity: {growth:.2f}x (target: no growth, ~1x)")
    print(f"RESULT controller_groups_per_s {min(r[1] for r in rows):.0f}")


if __name__ == "__main__":
    main()
