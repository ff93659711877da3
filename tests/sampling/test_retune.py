"""Re-tuning a sampler's window and the buffer's capacity (issue 38): the
transition rules of asyncrl.sampling.RetunableSampler and RolloutBuffer.set_capacity."""

from __future__ import annotations

import asyncio
import random

import pytest

from asyncrl.buffer import RolloutBuffer
from asyncrl.sampling import (
    InOrderSampler,
    ReadyFirstSampler,
    RetunableSampler,
    WeightFifoSampler,
    WindowedSampler,
)
from asyncrl.version import TrainerVersion

from .helpers import VARIANTS, make_twins, variant_id

variants = pytest.mark.parametrize("variant", VARIANTS, ids=[variant_id(v) for v in VARIANTS])


def test_every_builtin_is_retunable() -> None:
    for cls in (InOrderSampler, WeightFifoSampler, WindowedSampler, ReadyFirstSampler):
        assert isinstance(cls(RolloutBuffer(4)), RetunableSampler)


def _ready(buf: RolloutBuffer, gid: str, weight: int, target: int | None = None) -> None:
    buf.reserve_nowait(gid, start_weight=weight, target_step=target)
    buf.commit(gid, payload=None)


async def test_a_shrink_never_evicts_a_group_legal_when_it_started() -> None:
    buf = RolloutBuffer(20)
    sampler = WindowedSampler(buf, max_staleness_versions=3)
    for w in range(5):
        _ready(buf, f"w{w}", w)  # started at versions 0..4, all under window 3
    sampler.set_window(1, version=4)
    # At v=5 the old window keeps w=2..4 (legal under 3); only w<2 goes.
    assert await sampler.evict(current_train_weight=5) == 2
    assert sampler.max_staleness() == 3 and sampler.required_buffer_capacity(2) is None
    assert sampler.should_abort_inflight(start_weight_version=2, current_train_weight=5) is False
    # A group started after the change, at 5: held to the old window too while
    # the hold lasts (looser, never stricter).
    _ready(buf, "new", 5)
    # v=7: w=4 is still legal under 3 (7-4=3): kept.
    assert await sampler.evict(current_train_weight=7) == 2  # w2, w3
    assert {s.group_id for s in buf.slots()} == {"w4", "new"}
    # v=8 > 4+3: w4 (8-4=4 > 3) goes under the old window; at the next step
    # boundary the hold expires and the new window (1) applies: "new" (8-5=3 > 1) goes.
    sampler.step_boundary(8)
    assert sampler.max_staleness() == 3, "w4 is still here: the hold stays"
    assert await sampler.evict(current_train_weight=8) == 1
    sampler.step_boundary(8)
    assert sampler.window_in_force(8) == 1 and sampler.max_staleness() == 1
    assert await sampler.evict(current_train_weight=8) == 1
    assert len(buf) == 0


def test_a_shrink_holds_while_an_old_group_is_in_flight() -> None:
    buf = RolloutBuffer(4)
    sampler = WindowedSampler(buf, max_staleness_versions=2, staleness_of="end_weight")
    buf.reserve_nowait("slow", start_weight=0)  # in flight since version 0
    sampler.set_window(0, version=1)
    sampler.step_boundary(10)
    assert sampler.window_in_force(10) == 2, "an old group is still in the buffer"
    buf.release("slow")
    sampler.step_boundary(10)
    assert sampler.window_in_force(10) == 0


def test_a_raise_takes_effect_at_once() -> None:
    sampler = WeightFifoSampler(RolloutBuffer(4), max_staleness_versions=1)
    sampler.set_window(3, version=2)
    assert sampler.window_in_force(2) == 3
    assert sampler.required_buffer_capacity(2) == 8 and sampler.max_staleness() == 3


async def test_a_wider_window_wakes_a_waiting_admit() -> None:
    sampler = InOrderSampler(RolloutBuffer(8), max_lookahead_versions=0)
    version = TrainerVersion(0)
    assert await sampler.admit(trainer_version=version) == 0
    waiting = asyncio.ensure_future(sampler.admit(trainer_version=version))
    for _ in range(3):
        await asyncio.sleep(0)
    assert not waiting.done() and version.waiters_blocked()
    sampler.set_window(1, version=0)  # d=1 <= 0 + 1 now holds, with no new version
    assert not version.waiters_blocked(), "a woken waiter must not count as blocked"
    for _ in range(3):
        await asyncio.sleep(0)
    assert waiting.done() and waiting.result() == 1


def test_set_window_rejects_bad_values() -> None:
    sampler = InOrderSampler(RolloutBuffer(4))
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="window must be an integer >= 0"):
            sampler.set_window(bad, version=0)  # type: ignore[arg-type]


def test_capacity_shrink_follows_the_slots_down() -> None:
    buf = RolloutBuffer(6)
    for i in range(5):
        buf.reserve_nowait(i, start_weight=0)
    buf.set_capacity(2)
    assert buf.capacity == 5 and buf.is_full(), "never below the occupancy"
    buf.release(0)
    assert buf.capacity == 4 and buf.is_full()
    for i in (1, 2):
        buf.release(i)
    assert buf.capacity == 2 and buf.is_full()
    buf.release(3)
    assert buf.capacity == 2 and not buf.is_full()
    buf.set_capacity(7)
    assert buf.capacity == 7


async def test_capacity_raise_wakes_a_waiting_reserve() -> None:
    buf = RolloutBuffer(1)
    buf.reserve_nowait("a", start_weight=0)
    waiting = asyncio.ensure_future(buf.reserve("b", start_weight=0))
    await asyncio.sleep(0)
    assert not waiting.done()
    buf.set_capacity(2)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert waiting.done() and len(buf) == 2


@variants
@pytest.mark.parametrize("seed", range(3))
async def test_contract_holds_with_retuning_at_random_step_boundaries(
    variant: tuple[str, int, bool], seed: int
) -> None:
    """The contract test of test_contract.py with the window moving between steps:
    evict and select touch only ready slots and never repeat; a slot is evicted
    only when it is too old for the window it started under; no selected slot
    is staler than the ``max_staleness`` the sampler declares for that step."""
    rng = random.Random(seed)
    buf, sampler, ref = make_twins(variant, capacity=40)
    started_under: dict[object, int] = {}
    seen: set[object] = set()
    stamped = ref.policy == "in_order"
    next_id = 0
    for v in range(12):
        sampler.step_boundary(v)
        if v and rng.random() < 0.5:
            sampler.set_window(rng.randint(0, 3), version=v)
        # Groups start now, under the window just set.
        for _ in range(min(rng.randint(0, 5), buf.capacity - len(buf))):
            gid, next_id = f"s{seed}-{next_id}", next_id + 1
            target = v + rng.randint(0, sampler.window) if stamped else None
            buf.reserve_nowait(gid, start_weight=v, target_step=target)
            started_under[gid] = sampler.window
            if rng.random() < 0.8:
                buf.commit(gid, payload=None)
        before = {s.group_id: s for s in buf.slots()}
        await sampler.evict(current_train_weight=v)
        for gid, slot in before.items():
            if gid in buf:
                continue
            assert slot.ready, "evict removed an in-flight slot"
            if not stamped:
                assert v - slot.start_weight > started_under[gid], (
                    f"{gid} evicted at v={v}: legal under window {started_under[gid]}")
        bound = sampler.max_staleness()
        chosen = await sampler.select(current_train_weight=v, min_prompt_groups=1,
                                      max_prompt_groups=rng.randint(1, 6)) or []
        for slot in chosen:
            assert slot.ready and slot.group_id not in seen
            seen.add(slot.group_id)
            if bound is not None:
                assert v - slot.start_weight <= bound, (slot, v, bound)
        # Commit some in-flight ones.
        for slot in list(buf.slots()):
            if not slot.ready and rng.random() < 0.5:
                buf.commit(slot.group_id, payload=None, end_weight=v)


async def test_a_shrink_before_the_first_admission_holds_nothing() -> None:
    # No group started under the old window (async_rl.autopilot.reuse applies a
    # profile's setting then): the new one is in force at once.
    sampler = InOrderSampler(RolloutBuffer(12), max_lookahead_versions=2)
    sampler.set_window(1, version=0)
    assert sampler.window_in_force(0) == 1 and sampler.required_buffer_capacity(4) == 8
    # Once a batch was admitted, a group may be on its way: the shrink holds.
    admitted = InOrderSampler(RolloutBuffer(12), max_lookahead_versions=2)
    assert await admitted.admit(trainer_version=TrainerVersion(0)) == 0
    admitted.set_window(1, version=0)
    assert admitted.window_in_force(0) == 2 and admitted.required_buffer_capacity(4) == 12
