"""Cost of one train-step cycle of every built-in sampler, against a linear scan.

A cycle is what the train pump does per chunk, plus the rollout side refilling
what it consumed: ``evict`` + ``select`` of 64 groups, then ``reserve`` and
``commit`` of as many new groups as left the buffer, so the buffer size stays
stable. It runs with 1e3, 1e4 and 1e5 groups buffered, spread over the weight
versions of a window of s = 4 (v = 10, start weights 6..10; 2% of the slots in
flight at the newest version), once on our buffer+sampler and once on the
linear-scan reference model of ``tests/sampling/reference.py`` (the test
oracle), which scans its list of slots for every query and lookup.

Every cycle really selects 64 groups: new groups are generated with the current
weights (and, for in_order, stamped for the current step), so enough stay
eligible under every policy.

Run: ``.venv/bin/python benchmarks/bench_sampler.py``. Targets: at 1e5 groups
every policy is >= 50x faster than the reference, and its own cost at 1e5 is
within 3x of its cost at 1e3. The last line is
``RESULT sampler_speedup_vs_scan_1e5 <smallest speedup over policies>``.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "sampling"))

from reference import ReferenceModel  # noqa: E402

from asyncrl.buffer import RolloutBuffer  # noqa: E402
from asyncrl.sampling import create_sampler  # noqa: E402

SIZES = (1_000, 10_000, 100_000)
WINDOW = 4
VERSION = 10
CHUNK = 64
INFLIGHT_FRACTION = 0.02
# (label, policy, sample_freshest_first)
POLICIES = [
    ("in_order", "in_order", False),
    ("weight_fifo", "weight_fifo", False),
    ("windowed", "windowed", False),
    ("windowed+freshest", "windowed", True),
    ("ready_first", "ready_first", False),
]
# Wall-clock budget per measurement; the reference gets fewer cycles at large sizes.
OURS_SECONDS = 0.4
REF_SECONDS = 0.4
MIN_CYCLES = 3


def _initial_slots(size: int, stamped: bool) -> list[tuple[int, int | None, bool]]:
    """(start_weight, target_step, ready) per slot, in dispatch order.

    Older weights were dispatched first; in_order stamps spread over the
    current step and the ``WINDOW`` steps it may run ahead.
    """
    inflight = int(size * INFLIGHT_FRACTION)
    slots = []
    for i in range(size):
        band = (i * (WINDOW + 1)) // size
        weight = VERSION - WINDOW + band
        target = VERSION + band if stamped else None
        slots.append((weight, target, i < size - inflight))
    return slots


class _Ours:
    def __init__(self, policy: str, fresh: bool, size: int) -> None:
        self.buffer = RolloutBuffer(size)
        self.ref_twin = ReferenceModel(policy, WINDOW, capacity=size, freshest_first=fresh)
        self.sampler = create_sampler(self.buffer, self.ref_twin.config())
        self.stamped = policy == "in_order"
        self.ids = itertools.count()
        for weight, target, ready in _initial_slots(size, self.stamped):
            gid = next(self.ids)
            self.buffer.reserve_nowait(gid, start_weight=weight, target_step=target)
            if ready:
                self.buffer.commit(gid, None, end_weight=weight)

    async def cycles(self, n: int) -> None:
        buffer, sampler, ids = self.buffer, self.sampler, self.ids
        target = VERSION if self.stamped else None
        for _ in range(n):
            evicted = await sampler.evict(current_train_weight=VERSION)
            chosen = await sampler.select(
                current_train_weight=VERSION, min_prompt_groups=CHUNK, max_prompt_groups=CHUNK
            )
            assert chosen is not None and len(chosen) == CHUNK
            for _ in range(CHUNK + evicted):
                gid = next(ids)
                await buffer.reserve(gid, start_weight=VERSION, target_step=target)
                buffer.commit(gid, None, end_weight=VERSION)

    def run(self, n: int) -> None:
        asyncio.run(self.cycles(n))


class _Reference:
    def __init__(self, policy: str, fresh: bool, size: int) -> None:
        self.model = ReferenceModel(policy, WINDOW, capacity=size, freshest_first=fresh)
        self.stamped = policy == "in_order"
        self.ids = itertools.count()
        for weight, target, ready in _initial_slots(size, self.stamped):
            gid = next(self.ids)
            self.model.reserve(gid, weight, target)
            if ready:
                self.model.commit(gid, None, weight)

    def run(self, n: int) -> None:
        model, ids = self.model, self.ids
        target = VERSION if self.stamped else None
        for _ in range(n):
            evicted = len(model.evict(VERSION))
            chosen = model.select(VERSION, CHUNK, CHUNK)
            assert chosen is not None and len(chosen) == CHUNK
            for _ in range(CHUNK + evicted):
                gid = next(ids)
                model.reserve(gid, VERSION, target)
                model.commit(gid, None, VERSION)


def _mean_cycle_us(impl: Any, budget_s: float) -> float:
    """Mean µs per cycle: one warm-up cycle, then batches until the budget is spent."""
    impl.run(1)
    cycles, elapsed = 0, 0.0
    batch = 1
    gc_was_enabled = gc.isenabled()
    gc.disable()  # as timeit does: collector pauses are noise, not the cost measured
    try:
        while elapsed < budget_s or cycles < MIN_CYCLES:
            start = time.perf_counter()
            impl.run(batch)
            elapsed += time.perf_counter() - start
            cycles += batch
            batch = min(batch * 2, 64)
    finally:
        if gc_was_enabled:
            gc.enable()
    return elapsed / cycles * 1e6


def main() -> int:
    header = (
        f"{'policy':<18} {'size':>7} {'ours µs':>10} {'reference µs':>13} "
        f"{'speedup':>9} {'ours@1e5/ours@1e3':>18}"
    )
    print(
        f"one cycle = evict + select({CHUNK}) + reserve/commit of {CHUNK} new groups; "
        f"window s={WINDOW}, v={VERSION}"
    )
    print(header)
    print("-" * len(header))
    speedups_1e5: dict[str, float] = {}
    scaling: dict[str, float] = {}
    for label, policy, fresh in POLICIES:
        ours_by_size: dict[int, float] = {}
        for size in SIZES:
            ours = _mean_cycle_us(_Ours(policy, fresh, size), OURS_SECONDS)
            ref = _mean_cycle_us(_Reference(policy, fresh, size), REF_SECONDS)
            ours_by_size[size] = ours
            speedup = ref / ours
            ratio = ""
            if size == SIZES[-1]:
                speedups_1e5[label] = speedup
                scaling[label] = ours / ours_by_size[SIZES[0]]
                ratio = f"{scaling[label]:.2f}x"
            print(
                f"{label:<18} {size:>7} {ours:>10.1f} {ref:>13.1f} {speedup:>8.1f}x {ratio:>18}",
                flush=True,
            )
    worst_speedup = min(speedups_1e5.values())
    worst_scaling = max(scaling.values())
    print("-" * len(header))
    print(
        f"targets at 1e5: speedup >= 50x: {'PASS' if worst_speedup >= 50 else 'FAIL'} "
        f"(smallest {worst_speedup:.1f}x); ours@1e5 <= 3x ours@1e3: "
        f"{'PASS' if worst_scaling <= 3 else 'FAIL'} (largest {worst_scaling:.2f}x)"
    )
    print(f"RESULT sampler_speedup_vs_scan_1e5 {worst_speedup:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
