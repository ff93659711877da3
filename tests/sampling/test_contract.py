"""Every built-in policy honours the PromptGroupSampler contract (docs/design.md)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.sampling import (
    InOrderSampler,
    PromptGroupSampler,
    ReadyFirstSampler,
    WeightFifoSampler,
    WindowedSampler,
    missing_protocol_members,
)

from .helpers import VARIANTS, make_twins, populate, variant_id

variants = pytest.mark.parametrize("variant", VARIANTS, ids=[variant_id(v) for v in VARIANTS])


@variants
def test_satisfies_the_protocol(variant: tuple[str, int, bool]) -> None:
    _, sampler, _ = make_twins(variant, capacity=4)
    assert isinstance(sampler, PromptGroupSampler)
    assert missing_protocol_members(sampler) == []


@variants
@pytest.mark.parametrize("seed", range(4))
async def test_select_and_evict_only_touch_ready_slots_and_never_repeat(
    variant: tuple[str, int, bool], seed: int
) -> None:
    rng = random.Random(seed)
    buf, sampler, ref = make_twins(variant, capacity=60)
    populate(rng, buf, ref, count=60)
    seen: set[object] = set()

    for v in range(0, 9):
        unready_before = {s.group_id for s in buf.slots() if not s.ready}
        ready_before = {s.group_id for s in buf.slots() if s.ready}
        evicted = await sampler.evict(current_train_weight=v)
        after_evict = {s.group_id for s in buf.slots()}
        assert unready_before <= after_evict, "evict removed an in-flight slot"
        assert len(ready_before - after_evict) == evicted

        for _ in range(3):
            hi = rng.randint(1, 6)
            lo = rng.randint(1, hi)
            chosen = await sampler.select(
                current_train_weight=v, min_prompt_groups=lo, max_prompt_groups=hi
            )
            if chosen is None:
                continue
            # The train pump refuses fewer than min (an empty list too) as a breach.
            assert isinstance(chosen, list) and lo <= len(chosen) <= hi
            assert all(isinstance(s, Slot) for s in chosen)
            ids = [s.group_id for s in chosen]
            assert len(set(ids)) == len(ids), "select returned a group twice"
            assert not seen & set(ids), "select returned a group it had returned before"
            seen.update(ids)
            for slot in chosen:
                assert slot.ready, f"select returned the unready slot {slot.group_id}"
                assert slot.group_id not in buf, "selected slots must be removed from the buffer"
                assert ref.in_window(slot, v), f"{slot} is outside the window at v={v}"
        # New in-flight and finished groups keep arriving between steps; the
        # reference only supplies the window test here, so it just mirrors the slots.
        ref.slots = [s for s in ref.slots if s.group_id in buf]
        if len(buf) < buf.capacity:
            populate(rng, buf, ref, count=min(5, buf.capacity - len(buf)), max_weight=v + 1)


@variants
async def test_select_is_greedy_and_returns_none_below_min(variant: tuple[str, int, bool]) -> None:
    buf, sampler, ref = make_twins(variant, capacity=20)
    # Five ready groups that every policy may take at v = 2: weight 2, stamped 2.
    for i in range(5):
        buf.reserve_nowait(i, start_weight=2, target_step=2 if ref.policy == "in_order" else None)
        buf.commit(i, payload=None)

    assert (
        await sampler.select(current_train_weight=2, min_prompt_groups=6, max_prompt_groups=8)
        is None
    )
    assert len(buf) == 5, "a select that returns None must not remove anything"

    chosen = await sampler.select(current_train_weight=2, min_prompt_groups=1, max_prompt_groups=3)
    assert chosen is not None and [s.group_id for s in chosen] == [0, 1, 2]
    chosen = await sampler.select(current_train_weight=2, min_prompt_groups=2, max_prompt_groups=9)
    assert chosen is not None and [s.group_id for s in chosen] == [3, 4]
    assert len(buf) == 0


@variants
@pytest.mark.parametrize(("lo", "hi"), [(0, 1), (2, 1), (-1, 3)])
async def test_select_rejects_bad_bounds(variant: tuple[str, int, bool], lo: int, hi: int) -> None:
    _, sampler, _ = make_twins(variant, capacity=4)
    with pytest.raises(ValueError, match="1 <= min_prompt_groups <= max_prompt_groups"):
        await sampler.select(current_train_weight=0, min_prompt_groups=lo, max_prompt_groups=hi)


# The semantics table, written out by hand (not computed from the reference).
# policy -> (required capacity for 8 groups per step as f(s), aborts (start, v, s) -> bool)
@pytest.mark.parametrize("window", [0, 1, 2, 5])
@pytest.mark.parametrize(
    ("cls", "knob", "capacity_of", "aborts"),
    [
        (InOrderSampler, "max_lookahead_versions", lambda s: 8 * (s + 1), lambda w, v, s: False),
        (
            WeightFifoSampler,
            "max_staleness_versions",
            lambda s: 8 * (s + 1),
            lambda w, v, s: w < v - s,
        ),
        (WindowedSampler, "max_staleness_versions", lambda s: None, lambda w, v, s: w < v - s),
        (ReadyFirstSampler, "max_staleness_versions", lambda s: 8 * (s + 1), lambda w, v, s: False),
    ],
    ids=["in_order", "weight_fifo", "windowed", "ready_first"],
)
def test_derived_facts_match_the_table(
    window: int,
    cls: type,
    knob: str,
    capacity_of: Callable[[int], int | None],
    aborts: Callable[[int, int, int], bool],
) -> None:
    sampler = cls(RolloutBuffer(4), **{knob: window})
    assert sampler.is_on_policy is (window == 0)
    assert sampler.required_buffer_capacity(8) == capacity_of(window)
    for v in range(8):
        for start in range(v + 1):
            assert sampler.should_abort_inflight(
                start_weight_version=start, current_train_weight=v
            ) is aborts(start, v, window), (start, v)
    expected_staleness = (None if window else 0) if cls is ReadyFirstSampler else window
    assert sampler.max_staleness() == expected_staleness


@variants
def test_derived_facts_agree_with_the_reference(variant: tuple[str, int, bool]) -> None:
    _, sampler, ref = make_twins(variant, capacity=4)
    assert sampler.is_on_policy == ref.is_on_policy
    for groups in (1, 4, 16):
        assert sampler.required_buffer_capacity(groups) == ref.required_buffer_capacity(groups)
    assert sampler.max_staleness() == ref.max_staleness()


@pytest.mark.parametrize(
    "cls", [InOrderSampler, WeightFifoSampler, WindowedSampler, ReadyFirstSampler]
)
@pytest.mark.parametrize("bad", [-1, 1.5, True, "2"])
def test_bad_window_is_rejected(cls: type, bad: object) -> None:
    knob = "max_lookahead_versions" if cls is InOrderSampler else "max_staleness_versions"
    with pytest.raises(ValueError, match=f"{knob} must be an integer >= 0"):
        cls(RolloutBuffer(4), **{knob: bad})


def test_sampler_needs_the_buffer_first() -> None:
    with pytest.raises(TypeError, match="takes the RolloutBuffer as its first argument"):
        InOrderSampler(object())  # type: ignore[arg-type]
