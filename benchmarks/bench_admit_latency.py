"""Latency from ``TrainerVersion.set(v+1)`` to the next dispatch reaching the engine.

Real event loop, the real Controller (in_order, lookahead 0, so every batch
waits for the version), zero-cost fake engine and trainer. The reference in the same run is the
usual design this replaces: an admission gate that polls the version every 5 ms.
Target: p99 < 1 ms. Last line: ``RESULT admit_latency_p99_ms <value>``.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller import Controller
from asyncrl.version import TrainerVersion

ROUNDS = 2000
PER_STEP = 4


def _time_sets(version: TrainerVersion) -> dict[int, float]:
    """Record when each version is set (the instant the gate may open)."""
    set_at: dict[int, float] = {}
    plain_set = version.set

    def timed_set(value: int) -> None:
        set_at[value] = time.perf_counter()
        plain_set(value)

    version.set = timed_set  # type: ignore[method-assign]
    return set_at


class _ZeroCostEngine(FakeEngine):
    """Returns at once and notes when the first group of each stamp arrives."""

    def __init__(self) -> None:
        super().__init__(0.0)
        self.first_seen: dict[int, float] = {}

    async def generate(self, request):
        stamp = request.prompt.prompt_id // PER_STEP
        self.first_seen.setdefault(stamp, time.perf_counter())
        return await super().generate(request)


async def event_driven() -> list[float]:
    """The real Controller, in_order lookahead 0: every batch waits for the version."""
    engine = _ZeroCostEngine()
    task = FakeTask()
    ctl = Controller(
        task=task, engines=[engine], trainer=FakeTrainer(step_time=0.0),
        grpo=GRPOConfig(num_prompts_per_step=PER_STEP, num_generations_per_prompt=1,
                        max_num_steps=ROUNDS),
        async_rl=AsyncRLConfig(sampler={"name": "in_order", "max_lookahead_versions": 0},
                               max_buffered_rollouts=PER_STEP,
                               min_groups_for_streaming_train=PER_STEP,
                               max_inflight_prompts=PER_STEP),
        scorer=InlineScorer(task),
    )
    set_at = _time_sets(ctl.version)
    await ctl.run()
    return [
        (engine.first_seen[v] - set_at[v]) * 1e3
        for v in range(1, ROUNDS)
        if v in engine.first_seen
    ]


async def polling(interval: float = 0.005, rounds: int = 200) -> list[float]:
    """Reference: the gate re-checks the version every ``interval`` seconds."""
    state = {"v": 0}
    arrived: asyncio.Queue[float] = asyncio.Queue()

    async def rollout_pump() -> None:
        d = 0
        while True:
            while d > state["v"]:
                await asyncio.sleep(interval)
            arrived.put_nowait(time.perf_counter())
            d += 1

    pump = asyncio.create_task(rollout_pump())
    await arrived.get()
    latencies = []
    for v in range(1, rounds + 1):
        # Let the poller settle into its wait at a random phase of its period.
        await asyncio.sleep(interval * ((v * 7919) % 10) / 10 + interval)
        t0 = time.perf_counter()
        state["v"] = v
        t1 = await arrived.get()
        latencies.append((t1 - t0) * 1e3)
    pump.cancel()
    return latencies


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000)[int(q * 1000) - 1]


def main() -> None:
    ours = asyncio.run(event_driven())
    ref = asyncio.run(polling())
    print(f"{'gate':<22}{'p50 ms':>10}{'p99 ms':>10}{'max ms':>10}")
    for name, vals in (("event-driven (ours)", ours), ("5 ms polling (ref)", ref)):
        print(f"{name:<22}{p(vals, 0.5):>10.4f}{p(vals, 0.99):>10.4f}{max(vals):>10.4f}")
    p99 = p(ours, 0.99)
    print(f"p99 ratio polling/ours: {p(ref, 0.99) / p99:.1f}x  (target: ours p99 < 1 ms)")
    print(f"RESULT admit_latency_p99_ms {p99:.4f}")


if __name__ == "__main__":
    main()
