"""RolloutBuffer: slots, back-pressure, wake-ups, typed misuse errors, persistence, indexes."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.errors import (
    BufferStateError,
    DuplicateGroupError,
    GroupStateError,
    GroupStillGenerating,
    UnknownGroupError,
)
from tests.vtime import settle, virtual


def _ids(slots: Any) -> list[Any]:
    return [s.group_id for s in slots]


async def _filled(capacity: int, n: int, *, start_weight: int = 0) -> RolloutBuffer:
    buf = RolloutBuffer(capacity)
    for i in range(n):
        await buf.reserve(f"g{i}", start_weight=start_weight)
    return buf


# --------------------------------------------------------------------- basics
@virtual
async def test_reserve_commit_release_remove_lifecycle() -> None:
    buf = RolloutBuffer(capacity=4)
    assert (len(buf), buf.ready_count, buf.capacity) == (0, 0, 4)

    slot = await buf.reserve("a", start_weight=2, target_step=5)
    assert isinstance(slot, Slot)
    assert (slot.group_id, slot.start_weight, slot.target_step) == ("a", 2, 5)
    assert not slot.ready and slot.payload is None and slot.end_weight is None
    assert "a" in buf and len(buf) == 1 and buf.ready_count == 0

    await buf.reserve("b", start_weight=2)
    committed = buf.commit("a", {"tokens": [1, 2]}, end_weight=3)
    assert committed is slot
    assert slot.ready and slot.payload == {"tokens": [1, 2]} and slot.end_weight == 3
    assert (len(buf), buf.ready_count, buf.reserved_count) == (2, 1, 1)

    released = buf.release("b")
    assert released.group_id == "b" and "b" not in buf
    assert (len(buf), buf.ready_count) == (1, 1)

    removed = buf.remove(["a"])
    assert removed == [slot]
    assert (len(buf), buf.ready_count) == (0, 0)


@virtual
async def test_commit_without_end_weight_defaults_to_start_weight() -> None:
    buf = await _filled(2, 1, start_weight=4)
    assert buf.commit("g0", None).end_weight == 4


@virtual
async def test_slots_iterate_in_dispatch_order_with_increasing_seq() -> None:
    buf = RolloutBuffer(capacity=8)
    for gid, w in [("x", 3), ("y", 1), ("z", 2), ("w", 0)]:
        await buf.reserve(gid, start_weight=w)
    buf.commit("z", "pz")
    buf.release("y")
    await buf.reserve("v", start_weight=0)
    slots = list(buf.slots())
    # Dispatch order, not weight order nor commit order; removal leaves no gap behind.
    assert _ids(slots) == ["x", "z", "w", "v"]
    seqs = [s.dispatch_seq for s in slots]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert seqs[-1] == 4  # "y" took seq 1 and it is never reused
    assert buf.oldest_seq() == seqs[0] == 0 and buf.next_seq == 5
    buf.release("x")
    assert buf.oldest_seq() == 2  # "z" (seq 2) is now the oldest slot held
    buf.remove(["z"])  # (ready: trained)
    buf.release("w")
    buf.release("v")
    assert buf.oldest_seq() is None and buf.next_seq == 5


@virtual
async def test_slots_is_a_snapshot_safe_to_mutate_under() -> None:
    buf = await _filled(4, 3)
    seen = []
    for slot in buf.slots():
        seen.append(slot.group_id)
        buf.release(slot.group_id)
    assert seen == ["g0", "g1", "g2"] and len(buf) == 0


def test_capacity_must_be_positive() -> None:
    for bad in (0, -1, 2.5, None):
        with pytest.raises(ValueError, match="max_buffered_rollouts"):
            RolloutBuffer(bad)  # type: ignore[arg-type]


@virtual
async def test_negative_start_weight_is_rejected() -> None:
    buf = RolloutBuffer(2)
    with pytest.raises(ValueError, match="start_weight must be >= 0"):
        await buf.reserve("a", start_weight=-1)
    assert len(buf) == 0


# ------------------------------------------------------------- back-pressure
@virtual
async def test_reserve_waits_while_full_and_wakes_on_release() -> None:
    buf = await _filled(2, 2)
    waiter = asyncio.create_task(buf.reserve("late", start_weight=0))
    await settle()
    assert not waiter.done()

    # A commit changes readiness but frees no capacity.
    buf.commit("g0", None)
    await settle()
    assert not waiter.done()

    buf.release("g1")
    await settle()
    assert waiter.done() and waiter.result().group_id == "late"
    assert _ids(buf.slots()) == ["g0", "late"]


@virtual
async def test_reserve_waits_while_full_and_wakes_on_remove() -> None:
    buf = await _filled(2, 2)
    buf.commit("g0", None)
    waiter = asyncio.create_task(buf.reserve("late", start_weight=0))
    await settle()
    assert not waiter.done()
    buf.remove(["g0"])
    await settle()
    assert waiter.done() and "late" in buf


@virtual
async def test_one_freed_slot_admits_one_waiter_and_capacity_is_never_exceeded() -> None:
    buf = await _filled(2, 2)
    waiters = [asyncio.create_task(buf.reserve(f"w{i}", start_weight=0)) for i in range(3)]
    await settle()
    assert not any(w.done() for w in waiters)

    buf.release("g0")
    await settle()
    assert sum(w.done() for w in waiters) == 1 and len(buf) == 2

    buf.release("g1")
    await settle()
    assert sum(w.done() for w in waiters) == 2 and len(buf) == 2

    # The last waiter still waits; cancelling it leaves the buffer untouched.
    pending = [w for w in waiters if not w.done()]
    assert len(pending) == 1
    pending[0].cancel()
    await settle()
    assert len(buf) == 2 and buf.capacity == 2


@virtual
async def test_reserve_nowait_raises_when_full() -> None:
    buf = await _filled(1, 1)
    with pytest.raises(GroupStateError, match=r"full \(1 slots\).*await buffer.reserve"):
        buf.reserve_nowait("b", start_weight=0)
    buf.release("g0")
    assert buf.reserve_nowait("b", start_weight=0).group_id == "b"


@virtual
async def test_a_waiting_reserve_rechecks_the_id_after_waking() -> None:
    buf = await _filled(1, 1)
    first = asyncio.create_task(buf.reserve("dup", start_weight=0))
    await settle()
    buf.release("g0")
    second = asyncio.create_task(buf.reserve("dup", start_weight=0))
    await settle()
    assert first.done() and first.exception() is None
    assert second.done() and isinstance(second.exception(), DuplicateGroupError)


# ------------------------------------------------------------- wait_changed
@pytest.mark.parametrize("change", ["commit", "release", "remove", "notify"])
@virtual
async def test_wait_changed_wakes_on_every_change(change: str) -> None:
    buf = await _filled(4, 2)
    buf.commit("g1", None)
    waiters = [asyncio.create_task(buf.wait_changed()) for _ in range(2)]
    await settle()
    assert not any(w.done() for w in waiters)

    if change == "commit":
        buf.commit("g0", None)
    elif change == "release":
        buf.release("g0")
    elif change == "remove":
        buf.remove(["g1"])
    else:
        buf.notify()
    await settle()
    assert all(w.done() for w in waiters)


@virtual
async def test_wait_changed_waits_for_the_next_change_not_a_past_one() -> None:
    buf = await _filled(4, 2)
    buf.commit("g0", None)  # a change before anyone waits is not remembered
    waiter = asyncio.create_task(buf.wait_changed())
    await settle()
    assert not waiter.done()
    buf.remove([])  # removing nothing changes nothing
    await settle()
    assert not waiter.done()
    buf.commit("g1", None)
    await settle()
    assert waiter.done()


# ------------------------------------------------------------------- misuse
@virtual
async def test_commit_of_unknown_group_raises_unknown_group_error() -> None:
    buf = await _filled(2, 1)
    with pytest.raises(UnknownGroupError, match="'nope' is not in the rollout buffer"):
        buf.commit("nope", None)
    # It is a KeyError too, so "KeyError-like" callers keep working.
    with pytest.raises(KeyError):
        buf.commit("nope", None)


@virtual
async def test_commit_twice_raises_group_state_error() -> None:
    buf = await _filled(2, 1)
    buf.commit("g0", "first")
    with pytest.raises(GroupStateError, match=r"'g0' is already committed.*exactly once"):
        buf.commit("g0", "second")
    assert buf.get("g0").payload == "first" and buf.ready_count == 1


@virtual
async def test_commit_with_end_weight_before_start_weight_is_rejected() -> None:
    buf = await _filled(2, 1, start_weight=3)
    with pytest.raises(GroupStateError, match="end_weight 2 is older than its start_weight 3"):
        buf.commit("g0", None, end_weight=2)
    assert not buf.get("g0").ready and buf.ready_count == 0


@virtual
async def test_release_of_a_ready_group_raises_group_state_error() -> None:
    buf = await _filled(2, 1)
    buf.commit("g0", None)
    with pytest.raises(GroupStateError, match=r"'g0' is ready.*Use remove\(\)"):
        buf.release("g0")
    assert "g0" in buf


@pytest.mark.parametrize("op", ["release", "remove", "get"])
@virtual
async def test_unknown_group_in_release_remove_get(op: str) -> None:
    buf = await _filled(2, 1)
    with pytest.raises(UnknownGroupError, match="'ghost'"):
        if op == "release":
            buf.release("ghost")
        elif op == "remove":
            buf.remove(["ghost"])
        else:
            buf.get("ghost")


@virtual
async def test_duplicate_group_id_raises_duplicate_group_error() -> None:
    buf = await _filled(3, 1)
    with pytest.raises(DuplicateGroupError, match="'g0' already has a slot"):
        await buf.reserve("g0", start_weight=0)
    with pytest.raises(DuplicateGroupError):
        buf.reserve_nowait("g0", start_weight=0)
    assert len(buf) == 1


@virtual
async def test_duplicate_id_is_rejected_before_waiting_for_space() -> None:
    buf = await _filled(1, 1)
    # The buffer is full, yet the duplicate fails at once instead of waiting.
    with pytest.raises(DuplicateGroupError):
        await buf.reserve("g0", start_weight=0)


@virtual
async def test_remove_is_all_or_nothing() -> None:
    buf = await _filled(4, 3)
    buf.commit("g0", None)
    changed = asyncio.create_task(buf.wait_changed())
    await settle()
    for bad, error in ((["g0", "ghost"], UnknownGroupError), (["g0", "g0"], UnknownGroupError),
                       (["g0", "g1"], GroupStillGenerating)):
        with pytest.raises(error):
            buf.remove(bad)
        assert _ids(buf.slots()) == ["g0", "g1", "g2"] and buf.ready_count == 1
    await settle()
    assert not changed.done()
    changed.cancel()


@virtual
async def test_remove_refuses_a_group_still_generating() -> None:
    """Its attempt would commit to, or be aborted from, a slot that is gone (a
    sampler's evict that did this broke the run far from the cause)."""
    buf = await _filled(4, 2)
    buf.commit("g0", None)
    with pytest.raises(GroupStillGenerating, match=r"group 'g1' is still generating; remove\(\) "
                                                   r"drops ready slots only \(nothing was removed\)"
                       ) as err:
        buf.remove(["g0", "g1"])
    assert err.value.group_id == "g1" and isinstance(err.value, GroupStateError)
    assert _ids(buf.slots()) == ["g0", "g1"] and buf.ready_count == 1
    buf.commit("g1", None)  # the group goes on: it commits to its slot
    assert _ids(buf.remove(iter(["g1", "g0"]))) == ["g1", "g0"] and len(buf) == 0


@virtual
async def test_remove_listeners_see_every_removed_slot() -> None:
    buf = await _filled(4, 3)
    seen: list[list[Any]] = []
    buf.add_remove_listener(lambda slots: seen.append(_ids(slots)))
    buf.commit("g0", None)
    buf.commit("g2", None)
    buf.remove(["g2", "g0"])
    buf.remove([])
    buf.release("g1")  # release is not a removal of a buffered result
    assert seen == [["g2", "g0"]]


# -------------------------------------------------------------- persistence
@virtual
async def test_load_of_a_state_larger_than_capacity_raises_buffer_state_error() -> None:
    big = await _filled(5, 5)
    small = RolloutBuffer(3)
    with pytest.raises(BufferStateError, match=r"holds 5 slots.*capacity is 3.*at least 5"):
        small.load_state_dict(big.state_dict())
    assert len(small) == 0


@pytest.mark.parametrize(
    "mutate",
    [
        lambda st: st.pop("slots"),
        lambda st: st.pop("next_seq"),
        lambda st: st.__setitem__("next_seq", 1),
        lambda st: st["slots"].reverse(),
        lambda st: st["slots"][1].__setitem__("group_id", st["slots"][0]["group_id"]),
    ],
    ids=["no-slots", "no-next-seq", "seq-beyond-next", "unordered", "duplicate-id"],
)
@virtual
async def test_malformed_state_raises_buffer_state_error(mutate: Any) -> None:
    buf = await _filled(4, 3)
    state = buf.state_dict()
    mutate(state)
    fresh = await _filled(4, 1)
    with pytest.raises(BufferStateError):
        fresh.load_state_dict(state)
    assert _ids(fresh.slots()) == ["g0"]  # a failed load leaves the buffer as it was


async def _random_buffer(rng: random.Random, capacity: int = 40, steps: int = 120) -> RolloutBuffer:
    """A buffer after a random mix of reserve/commit/release/remove."""
    buf = RolloutBuffer(capacity)
    next_id = 0
    for _ in range(steps):
        op = rng.random()
        slots = list(buf.slots())
        if op < 0.5 and not buf.is_full():
            target = rng.choice([None, rng.randrange(6)])
            await buf.reserve(next_id, start_weight=rng.randrange(6), target_step=target)
            next_id += 1
        elif op < 0.8 and any(not s.ready for s in slots):
            slot = rng.choice([s for s in slots if not s.ready])
            buf.commit(
                slot.group_id, f"p{slot.group_id}", end_weight=slot.start_weight + rng.randrange(2)
            )
        elif op < 0.9 and any(not s.ready for s in slots):
            buf.release(rng.choice([s for s in slots if not s.ready]).group_id)
        elif ready := [s for s in slots if s.ready]:
            buf.remove(
                [s.group_id for s in rng.sample(ready, k=min(len(ready), rng.randrange(1, 4)))]
            )
    return buf


def _fields(buf: RolloutBuffer) -> list[tuple[Any, ...]]:
    return [
        (
            s.group_id,
            s.start_weight,
            s.end_weight,
            s.target_step,
            s.ready,
            s.payload,
            s.dispatch_seq,
        )
        for s in buf.slots()
    ]


def _all_answers(buf: RolloutBuffer) -> list[Any]:
    """Every index query over a grid of arguments, as comparable values."""
    out: list[Any] = []
    for t in range(-1, 8):
        out.append(("by_target", t, _ids(buf.ready_by_target(t))))
        out.append(("target_below", t, _ids(buf.ready_target_below(t))))
        out.append(("count_at", t, buf.ready_count_at_weight(t)))
        for hi in range(t, 8):
            out.append(("min_start", t, hi, buf.min_start_weight(t, hi)))
            for fresh in (False, True):
                out.append(
                    (
                        "range",
                        t,
                        hi,
                        fresh,
                        _ids(buf.ready_in_weight_range(t, hi, freshest_first=fresh)),
                    )
                )
    return out


@pytest.mark.parametrize("seed", range(8))
@virtual
async def test_state_dict_round_trip_rebuilds_the_indexes(seed: int) -> None:
    buf = await _random_buffer(random.Random(seed))
    state = buf.state_dict()
    restored = RolloutBuffer(buf.capacity)
    await restored.reserve("stale", start_weight=0)  # replaced by the load
    restored.load_state_dict(state)

    assert _fields(restored) == _fields(buf)
    assert (len(restored), restored.ready_count) == (len(buf), buf.ready_count)
    assert _all_answers(restored) == _all_answers(buf)

    # The dispatch counter continues where the saved buffer left off.
    if not restored.is_full():
        nxt = await restored.reserve("new", start_weight=0)
        assert nxt.dispatch_seq == state["next_seq"]


@virtual
async def test_load_wakes_reservers_waiting_for_space() -> None:
    full = await _filled(2, 2)
    waiter = asyncio.create_task(full.reserve("late", start_weight=0))
    await settle()
    assert not waiter.done()
    full.load_state_dict((await _filled(2, 1)).state_dict())
    await settle()
    assert waiter.done() and _ids(full.slots()) == ["g0", "late"]


# ----------------------------------------------------- index queries vs scan
def _brute_range(
    slots: list[Slot], lo: int | None, hi: int | None, limit: int | None, fresh: bool
) -> list[Any]:
    hits = [
        s
        for s in slots
        if s.ready and (lo is None or s.start_weight >= lo) and (hi is None or s.start_weight <= hi)
    ]
    if fresh:
        hits = sorted(hits, key=lambda s: -s.start_weight)  # stable: dispatch order within a weight
    return _ids(hits[:limit] if limit is not None else hits)


_bound = st.one_of(st.none(), st.integers(-1, 7))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    lo=_bound,
    hi=_bound,
    limit=st.one_of(st.none(), st.integers(0, 10)),
    fresh=st.booleans(),
    target=st.integers(-1, 7),
)
def test_index_queries_match_brute_force(
    seed: int, lo: int | None, hi: int | None, limit: int | None, fresh: bool, target: int
) -> None:
    buf = asyncio.run(_random_buffer(random.Random(seed)))
    slots = list(buf.slots())
    ready = [s for s in slots if s.ready]

    assert _ids(
        buf.ready_in_weight_range(lo, hi, limit=limit, freshest_first=fresh)
    ) == _brute_range(slots, lo, hi, limit, fresh)
    assert _ids(buf.ready_by_target(target, limit=limit)) == _ids(
        [s for s in ready if s.target_step == target][:limit]
        if limit is not None
        else [s for s in ready if s.target_step == target]
    )
    assert _ids(buf.ready_target_below(target)) == _ids(
        [s for s in ready if s.target_step is not None and s.target_step < target]
    )
    assert buf.ready_count_at_weight(target) == sum(1 for s in ready if s.start_weight == target)
    assert buf.ready_count == len(ready)

    # min_start_weight looks at ALL slots, ready or not.
    if lo is not None and hi is not None:
        in_range = [s.start_weight for s in slots if lo <= s.start_weight <= hi]
        assert buf.min_start_weight(lo, hi) == (min(in_range) if in_range else None)


@virtual
async def test_min_start_weight_counts_unready_slots() -> None:
    buf = RolloutBuffer(4)
    await buf.reserve("old", start_weight=1)
    await buf.reserve("new", start_weight=2)
    buf.commit("new", None)
    assert buf.min_start_weight(0, 5) == 1  # "old" is in flight, still counted
    assert buf.ready_in_weight_range(1, 1) == []
    buf.release("old")
    assert buf.min_start_weight(0, 5) == 2
    assert buf.min_start_weight(3, 5) is None


def test_repr_summarises_sizes() -> None:
    assert repr(RolloutBuffer(3)) == "RolloutBuffer(capacity=3, slots=0, ready=0)"
