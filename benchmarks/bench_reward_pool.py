"""What scoring off the event loop costs: groups/s with a zero-cost reward.

A group is 8 completions; ``--concurrent`` groups are scored at once (as the
rollout pump would have them in flight). Three ways:

* direct:  the reward called inline on the event loop (the reference, in this
  run: what scoring cost before the pool, and what it must never do for a
  slow reward);
* threads: ``RewardPool`` with the default thread executor;
* processes: ``RewardPool`` with ``executor: process``.

The reward does nothing, so each row is pure pool overhead. Last line:
``RESULT reward_pool_overhead <microseconds per group added by the thread pool>``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from asyncrl.tasks.rewards import RewardPool, score_many
from asyncrl.types import Prompt

PROMPT = Prompt(0, "2+3=", "5")
COMPLETIONS = ["5", "4", "55", "", "5", "6", "5", "50"]


def zero_cost(prompt: Prompt, completion: str) -> float:
    return 0.0


async def direct(groups: int, concurrent: int) -> float:
    async def one() -> list[float]:
        return score_many(zero_cost, PROMPT, COMPLETIONS)

    t0 = time.perf_counter()
    for _ in range(groups // concurrent):
        await asyncio.gather(*(one() for _ in range(concurrent)))
    return groups / (time.perf_counter() - t0)


async def pooled(groups: int, concurrent: int, executor: str, workers: int) -> float:
    pool = RewardPool(zero_cost, executor=executor, num_workers=workers, timeout_s=30.0)
    try:
        # Warm-up: start the workers (processes take a while to spawn).
        await asyncio.gather(*(pool.score(PROMPT, COMPLETIONS) for _ in range(2 * workers)))
        t0 = time.perf_counter()
        for _ in range(groups // concurrent):
            await asyncio.gather(*(pool.score(PROMPT, COMPLETIONS) for _ in range(concurrent)))
        return groups / (time.perf_counter() - t0)
    finally:
        await pool.close()


def best(fn, repeats: int) -> float:
    return max(asyncio.run(fn()) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=4096)
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    g, c = args.groups, args.concurrent
    rows = [("direct (reference)", best(lambda: direct(g, c), args.repeats))]
    for executor, workers in (("thread", 1), ("thread", 4), ("process", 2)):
        rate = best(lambda e=executor, w=workers: pooled(g, c, e, w), args.repeats)
        rows.append((f"{executor} x{workers}", rate))
    reference = rows[0][1]
    print(f"{'scorer':<20}{'groups/s':>12}{'us/group':>10}{'overhead us':>13}{'direct/this':>13}")
    for name, rate in rows:
        overhead = 1e6 / rate - 1e6 / reference
        print(f"{name:<20}{rate:>12.0f}{1e6 / rate:>10.1f}{overhead:>13.1f}{reference / rate:>13.1f}")
    threads = rows[2][1]
    print(f"RESULT reward_pool_overhead {1e6 / threads - 1e6 / reference:.1f}")


if __name__ == "__main__":
    main()
