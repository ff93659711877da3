"""Group-granular rollout buffer with indexes for the staleness samplers.

Invariants (checked by tests, relied on by samplers and the controller):

* one slot per dispatched, not-yet-consumed prompt group, iterated in dispatch
  order (``dispatch_seq`` strictly increases with every reservation);
* ``len(buffer) <= capacity`` at all times: capacity bounds reserved **and**
  ready slots, which is the back-pressure the rollout pump feels;
* a slot is either reserved (in flight) or ready (committed), and only ready
  slots appear in the ready indexes.

The indexes make every sampler query cost O(answer * log n) (plus the number
of distinct weight versions in the queried range, which the staleness window
keeps small), never a scan of the whole buffer.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from asyncrl._util.change_signal import ChangeSignal
from asyncrl.buffer.ready_index import ReadyIndex
from asyncrl.errors import (
    BufferStateError,
    DuplicateGroupError,
    GroupStateError,
    GroupStillGenerating,
    UnknownGroupError,
)
from asyncrl.types import GroupId


@dataclass(eq=False, slots=True)
class Slot:
    """One prompt group's place in the buffer."""

    group_id: GroupId
    start_weight: int
    dispatch_seq: int
    target_step: int | None = None
    end_weight: int | None = None
    ready: bool = False
    payload: Any = field(default=None, repr=False)


class RolloutBuffer:
    """Slots for dispatched prompt groups; see module docstring for invariants."""

    def __init__(self, capacity: int) -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(
                f"RolloutBuffer capacity must be a positive integer, got {capacity!r}; "
                "set async_rl.max_buffered_rollouts to at least 1"
            )
        self._capacity = capacity
        #: Where set_capacity asked it to go (it follows down as slots leave).
        self._capacity_target = capacity
        self._changed = ChangeSignal()
        self._space = ChangeSignal()
        self._remove_listeners: list[Callable[[list[Slot]], None]] = []
        self._reset()

    def _reset(self) -> None:
        self._slots: dict[GroupId, Slot] = {}  # insertion order == dispatch order
        self._next_seq = 0
        self._ready_count = 0
        self._ready_by_weight = ReadyIndex()
        self._ready_by_target = ReadyIndex()
        # Ready slots by end_weight (staleness_of: end_weight), built by the
        # first query that needs it (start_weight policies never pay for it).
        self._ready_by_end: ReadyIndex | None = None
        # start_weight -> number of slots (ready or not) holding it
        self._weight_counts: dict[int, int] = {}
        self._all_weights = SortedList()  # the keys of _weight_counts, sorted
        self._last_weight = 0
        self._last_target: int | None = None

    # ------------------------------------------------------------------ sizes
    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def capacity_target(self) -> int:
        return self._capacity_target

    def set_capacity(self, target: int) -> None:
        """Re-tune the capacity. A raise takes effect at once (and wakes a waiting
        reserve); a shrink drops no slot: the capacity falls to ``max(target,
        len(self))`` and follows each slot that leaves down to ``target``."""
        if isinstance(target, bool) or not isinstance(target, int) or target < 1:
            raise ValueError(f"RolloutBuffer capacity must be a positive integer, got "
                             f"{target!r}; set async_rl.max_buffered_rollouts to at least 1")
        grew = target > self._capacity
        self._capacity_target = target
        self._capacity = max(target, len(self._slots))
        if grew:
            self._space.fire()
            self._changed.fire()  # the starvation check reads is_full()

    @property
    def ready_count(self) -> int:
        return self._ready_count

    @property
    def next_seq(self) -> int:  # the dispatch_seq the next reservation gets
        return self._next_seq

    def oldest_seq(self) -> int | None:  # of the oldest slot held; O(1): dispatch order
        return next(iter(self._slots.values())).dispatch_seq if self._slots else None

    @property
    def reserved_count(self) -> int:
        return len(self._slots) - self._ready_count

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._slots

    def is_full(self) -> bool:
        return len(self._slots) >= self._capacity

    def get(self, group_id: GroupId) -> Slot:
        try:
            return self._slots[group_id]
        except KeyError:
            raise UnknownGroupError(
                f"group {group_id!r} is not in the rollout buffer (it was never reserved, "
                "or was already released/removed)"
            ) from None

    def slots(self) -> Iterator[Slot]:
        """All slots in dispatch order."""
        return iter(list(self._slots.values()))

    # -------------------------------------------------------------- mutations
    async def reserve(
        self, group_id: GroupId, *, start_weight: int, target_step: int | None = None
    ) -> Slot:
        """Reserve a slot for a group about to be dispatched; waits while full."""
        self._check_new(group_id, start_weight)
        await self.wait_for_space()
        self._check_new(group_id, start_weight)
        return self._insert(group_id, start_weight, target_step)

    async def wait_for_space(self) -> None:
        """Wait until at least one slot is free (returns at once if one is)."""
        while len(self._slots) >= self._capacity:
            await self._space.wait()

    def reserve_nowait(
        self, group_id: GroupId, *, start_weight: int, target_step: int | None = None
    ) -> Slot:
        """Like :meth:`reserve` but raises :class:`GroupStateError` when full."""
        self._check_new(group_id, start_weight)
        if len(self._slots) >= self._capacity:
            raise GroupStateError(
                f"rollout buffer is full ({self._capacity} slots); cannot reserve {group_id!r} "
                "without waiting. Use 'await buffer.reserve(...)' to wait for space"
            )
        return self._insert(group_id, start_weight, target_step)

    def commit(self, group_id: GroupId, payload: Any, *, end_weight: int | None = None) -> Slot:
        """Mark a reserved group finished; its slot becomes ready."""
        slot = self._slots.get(group_id)
        if slot is None:
            slot = self.get(group_id)  # raises UnknownGroupError
        if slot.ready:
            raise GroupStateError(
                f"group {group_id!r} is already committed; each group is committed exactly once "
                "(a retried generation must not commit twice)"
            )
        end = slot.start_weight if end_weight is None else end_weight
        if end < slot.start_weight:
            raise GroupStateError(
                f"group {group_id!r}: end_weight {end} is older than its start_weight "
                f"{slot.start_weight}; an engine's weight version must never go backwards"
            )
        slot.ready, slot.payload, slot.end_weight = True, payload, end
        self._index_ready(slot)
        self._changed.fire()
        return slot

    def _index_ready(self, slot: Slot) -> None:
        self._ready_count += 1
        self._ready_by_weight.add(slot.start_weight, slot)
        if self._ready_by_end is not None:
            self._ready_by_end.add(slot.end_weight, slot)  # type: ignore[arg-type]
        if slot.target_step is not None:
            self._ready_by_target.add(slot.target_step, slot)

    def release(self, group_id: GroupId) -> Slot:
        """Drop an UNREADY slot (its generation failed or was aborted)."""
        slot = self.get(group_id)
        if slot.ready:
            raise GroupStateError(
                f"group {group_id!r} is ready; release() only drops in-flight slots. "
                "Use remove() for ready groups"
            )
        self._drop(slot)
        self._changed.fire()
        self._space.fire()
        return slot

    def remove(self, group_ids: Iterable[GroupId]) -> list[Slot]:
        """Drop ready slots (selected or evicted) and return them.

        All or nothing: every id is resolved and checked before any slot is
        dropped, so an unknown, repeated or still-generating id leaves the
        buffer, its listeners and its waiters exactly as they were. A group
        still generating is refused (:class:`GroupStillGenerating`): its attempt
        would commit to, or be aborted from, a slot that is gone.
        """
        ids = group_ids if isinstance(group_ids, (list, tuple)) else list(group_ids)
        targets: dict[GroupId, Slot] = {}
        slots = self._slots
        for gid in ids:
            try:
                slot = slots[gid]
            except KeyError:
                slot = self.get(gid)  # raises UnknownGroupError
            if not slot.ready:
                raise GroupStillGenerating(
                    f"group {gid!r} is still generating; remove() drops ready slots only "
                    "(nothing was removed)", gid)
            targets[gid] = slot
        # A repeat is found by the count, not by a lookup per id: this runs for
        # every selected group, on the simulator's hot path.
        if len(targets) != len(ids):
            raise UnknownGroupError(
                f"group {_first_repeat(ids)!r} appears twice in one remove() call; each slot can be "
                "removed once (nothing was removed)"
            )
        removed = [self._drop(slot) for slot in targets.values()]
        if removed:
            for listener in self._remove_listeners:
                listener(removed)
            self._changed.fire()
            self._space.fire()
        return removed

    def add_remove_listener(self, listener: Callable[[list[Slot]], None]) -> None:
        """Call ``listener(slots)`` after every :meth:`remove` (the controller's ledger hook)."""
        self._remove_listeners.append(listener)

    async def wait_changed(self) -> None:
        """Wait for the next commit, release or remove (or :meth:`notify`)."""
        await self._changed.wait()

    def notify(self) -> None:
        """Wake :meth:`wait_changed` waiters without a change to the slots.

        The controller uses it when something outside the buffer changed what a
        waiter should conclude (the prompt source ran dry, the run is stopping).
        """
        self._changed.fire()

    # ---------------------------------------------------------------- queries
    def ready_by_target(self, target_step: int, *, limit: int | None = None) -> list[Slot]:
        """Ready slots stamped ``target_step``, dispatch order."""
        return self._ready_by_target.in_range(target_step, target_step, limit=limit)

    def ready_target_below(self, target_step: int) -> list[Slot]:
        """Ready stamped slots with ``target_step < target_step``."""
        return self._ready_by_target.in_range(None, target_step - 1, limit=None)

    def ready_in_weight_range(
        self,
        lo: int | None,
        hi: int | None,
        *,
        limit: int | None = None,
        freshest_first: bool = False,
        by: str = "start_weight",
    ) -> list[Slot]:
        """Ready slots with ``lo <= start_weight <= hi`` (``by="end_weight"``: the
        version of their newest tokens).

        Dispatch order, or newest weight first when ``freshest_first``.
        """
        index = self._end_index() if by == "end_weight" else self._ready_by_weight
        return index.in_range(lo, hi, limit=limit, key_desc=freshest_first)

    def min_ready_end_weight(self, lo: int, hi: int) -> int | None:
        """Smallest end_weight in ``[lo, hi]`` over the ready slots."""
        for weight in self._end_index().keys_in(lo, hi):
            return weight
        return None

    def _end_index(self) -> ReadyIndex:
        """The end-weight index, built from the ready slots on first use. Groups
        finish in any order, so dispatch order across end weights is a merge."""
        if self._ready_by_end is None:
            index = ReadyIndex()
            index.monotone = False
            for slot in self._slots.values():
                if slot.ready:
                    index.add(slot.end_weight, slot)  # type: ignore[arg-type]
            self._ready_by_end = index
        return self._ready_by_end

    def min_start_weight(self, lo: int, hi: int) -> int | None:
        """Smallest start_weight in ``[lo, hi]`` over ALL slots (ready or not)."""
        for weight in self._all_weights.irange(lo, hi):
            return weight
        return None

    def ready_count_at_weight(self, start_weight: int) -> int:
        return self._ready_by_weight.count(start_weight)

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {
            "capacity": self._capacity,
            "next_seq": self._next_seq,
            "slots": [
                {
                    "group_id": s.group_id,
                    "start_weight": s.start_weight,
                    "end_weight": s.end_weight,
                    "target_step": s.target_step,
                    "ready": s.ready,
                    "payload": s.payload,
                    "dispatch_seq": s.dispatch_seq,
                }
                for s in self._slots.values()
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace the contents with ``state`` (capacity stays this buffer's own)."""
        try:
            slots = list(state["slots"])
            next_seq = int(state["next_seq"])
        except (KeyError, TypeError) as exc:
            raise BufferStateError(
                f"rollout buffer state is malformed (missing {exc}); "
                "pass a dict produced by RolloutBuffer.state_dict()"
            ) from None
        if len(slots) > self._capacity:
            raise BufferStateError(
                f"rollout buffer state holds {len(slots)} slots but this buffer's capacity is "
                f"{self._capacity}; raise async_rl.max_buffered_rollouts to at least {len(slots)}"
            )
        seqs = [int(s["dispatch_seq"]) for s in slots]
        if seqs != sorted(set(seqs)) or (seqs and seqs[-1] >= next_seq):
            raise BufferStateError(
                "rollout buffer state is inconsistent: dispatch_seq values must be unique, "
                "increasing and below next_seq"
            )
        ids = [s["group_id"] for s in slots]
        if len(set(ids)) != len(ids):
            raise BufferStateError("rollout buffer state holds a duplicate group id")
        self._reset()
        for s in slots:
            slot = Slot(
                group_id=s["group_id"],
                start_weight=int(s["start_weight"]),
                dispatch_seq=int(s["dispatch_seq"]),
                target_step=s.get("target_step"),
            )
            self._slots[slot.group_id] = slot
            self._count_weight(slot.start_weight)
            self._note_order(slot)
            if s.get("ready"):
                end = s.get("end_weight")
                slot.ready, slot.payload = True, s.get("payload")
                slot.end_weight = slot.start_weight if end is None else int(end)
                self._index_ready(slot)
        self._next_seq = next_seq
        self._changed.fire()
        self._space.fire()

    # --------------------------------------------------------------- internal
    def _check_new(self, group_id: GroupId, start_weight: int) -> None:
        if group_id in self._slots:
            raise DuplicateGroupError(
                f"group {group_id!r} already has a slot; group ids must be unique per run"
            )
        if start_weight < 0:
            raise ValueError(f"start_weight must be >= 0, got {start_weight}")

    def _insert(self, group_id: GroupId, start_weight: int, target_step: int | None) -> Slot:
        slot = Slot(group_id, start_weight, self._next_seq, target_step)
        self._next_seq += 1
        self._slots[group_id] = slot
        self._note_order(slot)
        self._count_weight(start_weight)
        return slot

    def _count_weight(self, weight: int) -> None:
        n = self._weight_counts.get(weight)
        if n is None:
            self._weight_counts[weight] = 1
            self._all_weights.add(weight)
        else:
            self._weight_counts[weight] = n + 1

    def _note_order(self, slot: Slot) -> None:
        """Track whether keys stayed monotone in dispatch order (see ReadyIndex)."""
        if len(self._slots) == 1:
            # An empty buffer has no order to violate: start afresh.
            self._ready_by_weight.monotone = self._ready_by_target.monotone = True
            self._last_weight, self._last_target = slot.start_weight, slot.target_step
            return
        if slot.start_weight < self._last_weight:
            self._ready_by_weight.monotone = False
        self._last_weight = slot.start_weight
        if slot.target_step is not None:
            if self._last_target is not None and slot.target_step < self._last_target:
                self._ready_by_target.monotone = False
            self._last_target = slot.target_step

    def _drop(self, slot: Slot) -> Slot:
        del self._slots[slot.group_id]
        if self._capacity > self._capacity_target:  # a shrink in progress
            self._capacity = max(self._capacity_target, len(self._slots))
        weight = slot.start_weight
        n = self._weight_counts[weight] - 1
        if n:
            self._weight_counts[weight] = n
        else:
            del self._weight_counts[weight]
            self._all_weights.remove(weight)
        if slot.ready:
            self._ready_count -= 1
            self._ready_by_weight.discard(slot.start_weight, slot)
            if self._ready_by_end is not None:
                self._ready_by_end.discard(slot.end_weight, slot)
            if slot.target_step is not None:
                self._ready_by_target.discard(slot.target_step, slot)
        return slot

    def __repr__(self) -> str:
        return (f"RolloutBuffer(capacity={self._capacity}, slots={len(self._slots)}, "
                f"ready={self._ready_count})")


def _first_repeat(ids: Iterable[GroupId]) -> GroupId | None:
    seen: set[GroupId] = set()
    for gid in ids:
        if gid in seen:
            return gid
        seen.add(gid)
    return None
