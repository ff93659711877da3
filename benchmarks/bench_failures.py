"""What failures cost the controller, and what a checkpoint costs the event loop.

1. Throughput of the whole controller loop with zero-cost engine, trainer and
   scorer (one core, real time, as bench_controller_overhead.py) when a share
   of the attempts fails - 0, 10 % and 40 %, as infra (engine) or as data
   (reward) failures - with budgets that absorb every failure (replaced with a
   fresh prompt). Reported as groups trained per second and attempts per second,
   each as a ratio to the failure-free run of the same process. A failed attempt
   is a whole extra attempt, so the groups/s ratio cannot beat the share of
   attempts that succeed; the attempts/s ratio is the controller's own overhead.
2. The longest stall of the event loop (the longest gap between ticks of a
   1 ms ticker) during a whole checkpoint (capture and write) by model size,
   against the capture done on the loop as before (reference, same run). Each
   size is checkpointed three times: the median and the worst are reported (on
   a shared machine a busy neighbour adds scheduling delays of its own).
   Target: < 50 ms at >= 50 M parameters.

Last line: ``RESULT loop_stall_during_checkpoint_ms <median stall, worst size >= 50 M>``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.checkpoint.test_capture_off_loop import big_trainer, fake_controller
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

from asyncrl.checkpoint.hook import CheckpointHook
from asyncrl.config import AsyncRLConfig, CheckpointConfig, GRPOConfig
from asyncrl.controller import Controller, MemoryHistory

PER_STEP, STEPS = 64, 150
ABSORB = {"max_infra_attempts_per_prompt": 5, "max_data_attempts_per_prompt": 2,
          "backoff_base_s": 1e-6, "max_backoff_s": 1e-6, "max_skipped_prompts": 10**9,
          "max_consecutive_dropped_prompts": 10**9, "on_dropped_prompt": "replace",
          "max_replacement_attempts": 10**9}


def throughput(rate: float, kind: str, seed: int) -> tuple[float, float]:
    """(groups trained per second, attempts per second)."""
    rng = random.Random(seed)
    task = FakeTask()
    infra = rate if kind == "infra" else 0.0
    data = rate if kind == "data" else 0.0
    engine = FakeEngine(0.0, fail=lambda _r: rng.random() < infra)
    scorer = InlineScorer(task, fail=lambda _p: rng.random() < data)
    ctl = Controller(
        task=task, engines=[engine], trainer=FakeTrainer(step_time=0.0),
        grpo=GRPOConfig(num_prompts_per_step=PER_STEP, num_generations_per_prompt=1,
                        max_num_steps=STEPS),
        async_rl=AsyncRLConfig(
            sampler={"name": "windowed", "max_staleness_versions": 10**9},
            max_buffered_rollouts=4 * PER_STEP, min_groups_for_streaming_train=1,
            max_inflight_prompts=4 * PER_STEP, rollout_failure=ABSORB, stall_watchdog=None),
        scorer=scorer, ledger_history=MemoryHistory())
    t0 = time.perf_counter()
    result = asyncio.run(ctl.run())
    elapsed = time.perf_counter() - t0
    assert result.summary["ledger"]["balanced"] and result.steps == STEPS
    attempts = sum(r.attempts for r in ctl.ledger.records())
    return result.summary["ledger"]["trained"] / elapsed, attempts / elapsed


async def longest_stall(work) -> float:
    """The longest gap (seconds) between ticks of a 1 ms ticker while ``work()`` runs."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.02)
    try:
        await work()
    finally:
        done.set()
        await tick
    return max(gaps)


def stalls(params: int, repeat: int = 3) -> tuple[list[float], float, float]:
    """(stalls of whole checkpoints ms, stall of the on-loop capture ms, checkpoint s)."""
    trainer = big_trainer(params)
    controller = fake_controller(trainer)
    with tempfile.TemporaryDirectory() as tmp:
        hook = CheckpointHook(tmp, CheckpointConfig(), config_yaml="seed: 0\n")

        async def main() -> tuple[list[float], float, float]:
            measured, t0 = [], time.perf_counter()
            for _ in range(repeat):
                measured.append(await longest_stall(lambda: hook.write_final(controller)) * 1e3)
            took = (time.perf_counter() - t0) / repeat

            async def on_loop() -> None:
                trainer.state_dict()

            return measured, await longest_stall(on_loop) * 1e3, took

        return asyncio.run(main())


def main() -> None:
    # One warning per failed attempt would measure the terminal, not the controller.
    logging.getLogger("asyncrl.controller").setLevel(logging.ERROR)
    print(f"controller, zero-cost backends: {PER_STEP} groups/step, {STEPS} steps, best of 3")
    base = max((throughput(0.0, "infra", s) for s in range(3)), key=lambda r: r[0])
    print(f"{'failures':>16}{'groups/s':>11}{'ratio':>8}{'attempts/s':>12}{'ratio':>8}")
    print(f"{'none':>16}{base[0]:>11.0f}{1.0:>8.2f}{base[1]:>12.0f}{1.0:>8.2f}")
    for kind in ("infra", "data"):
        for rate in (0.1, 0.4):
            gps, aps = max((throughput(rate, kind, s) for s in range(3)), key=lambda r: r[0])
            print(f"{f'{rate:.0%} {kind}':>16}{gps:>11.0f}{gps / base[0]:>8.2f}"
                  f"{aps:>12.0f}{aps / base[1]:>8.2f}")
    print()
    print("event loop during a checkpoint (capture + write) vs the capture on the loop")
    print(f"{'parameters':>12}{'stall ms median':>17}{'worst':>8}{'on-loop ms':>12}"
          f"{'checkpoint s':>14}")
    worst = 0.0
    for params in (10_000_000, 50_000_000, 100_000_000):
        measured, before, took = stalls(params)
        median = statistics.median(measured)
        print(f"{params / 1e6:>10.0f} M{median:>17.1f}{max(measured):>8.1f}{before:>12.1f}"
              f"{took:>14.2f}")
        if params >= 50_000_000:
            worst = max(worst, median)
    print(f"RESULT loop_stall_during_checkpoint_ms {worst:.1f}")


if __name__ == "__main__":
    main()
