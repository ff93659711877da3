"""A linear-scan reference model of the staleness-sampler semantics (docs/design.md).

This is an oracle for the tests and the baseline of ``benchmarks/bench_sampler.py``,
never used by the runtime. It is deliberately naive so that it can be checked by
reading it against the semantics table: the state is a plain list of slots in
dispatch order, and every operation scans that list. Nothing here is optimised.

Notation as in docs/design.md: ``v`` trainer version, ``s`` the policy's window,
``d`` the dispatch index of the batch being admitted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

POLICIES = ("in_order", "weight_fifo", "windowed", "ready_first")

# The config key that carries each built-in policy's window.
WINDOW_KEY = {
    "in_order": "max_lookahead_versions",
    "weight_fifo": "max_staleness_versions",
    "windowed": "max_staleness_versions",
    "ready_first": "max_staleness_versions",
}


@dataclass
class RefSlot:
    group_id: Any
    start_weight: int
    target_step: int | None
    ready: bool = False
    end_weight: int | None = None
    payload: Any = None


class ReferenceModel:
    """One built-in policy together with its own buffer, as a list of slots."""

    def __init__(
        self, policy: str, window: int, *, capacity: int, freshest_first: bool = False,
        staleness_of: str = "start_weight",
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}")
        if freshest_first and policy != "windowed":
            raise ValueError("freshest_first exists only for windowed")
        if staleness_of != "start_weight" and policy not in ("weight_fifo", "windowed"):
            raise ValueError("staleness_of exists only for weight_fifo and windowed")
        self.staleness_of = staleness_of
        self.policy = policy
        self.window = window
        self.capacity = capacity
        self.freshest_first = freshest_first
        self.slots: list[RefSlot] = []
        self.dispatch_index = 0

    def config(self) -> dict[str, Any]:
        """The sampler config that names the same policy (for ``create_sampler``)."""
        cfg: dict[str, Any] = {"name": self.policy, WINDOW_KEY[self.policy]: self.window}
        if self.policy == "windowed":
            cfg["sample_freshest_first"] = self.freshest_first
        if self.staleness_of != "start_weight":
            cfg["staleness_of"] = self.staleness_of
        return cfg

    def weight(self, slot: Any) -> int:
        """The weight the window bounds: ``start_weight``, or with ``staleness_of:
        end_weight`` the ``end_weight`` of a ready slot."""
        if self.staleness_of == "end_weight" and slot.ready:
            return slot.end_weight
        return slot.start_weight

    # ------------------------------------------------------------- admission
    def may_admit(self, v: int) -> bool:
        """May the batch with index ``self.dispatch_index`` go at trainer version ``v``?

        The table's "gate for batch d+1: wait until d < v + s" names the
        *previous* batch d; for the batch about to go (index d+1) that is
        ``d + 1 <= v + s``, which is the form used here.
        """
        if self.policy == "windowed":
            return True
        return self.dispatch_index <= v + self.window

    def admit(self, v: int) -> int | None:
        """Admit the next batch (the caller checked :meth:`may_admit`); return its stamp."""
        if not self.may_admit(v):
            raise AssertionError("reference: admit called while the gate is closed")
        d = self.dispatch_index
        self.dispatch_index += 1
        return d if self.policy == "in_order" else None

    # ---------------------------------------------------------------- buffer
    def is_full(self) -> bool:
        return len(self.slots) >= self.capacity

    @property
    def ready_count(self) -> int:
        return sum(1 for s in self.slots if s.ready)

    def find(self, group_id: Any) -> RefSlot:
        for slot in self.slots:
            if slot.group_id == group_id:
                return slot
        raise KeyError(group_id)

    def reserve(self, group_id: Any, start_weight: int, target_step: int | None = None) -> None:
        if self.is_full():
            raise AssertionError("reference: reserve called while full")
        if any(s.group_id == group_id for s in self.slots):
            raise AssertionError(f"reference: duplicate group {group_id!r}")
        self.slots.append(RefSlot(group_id, start_weight, target_step))

    def commit(self, group_id: Any, payload: Any = None, end_weight: int | None = None) -> None:
        slot = self.find(group_id)
        if slot.ready:
            raise AssertionError(f"reference: {group_id!r} committed twice")
        slot.ready = True
        slot.payload = payload
        slot.end_weight = slot.start_weight if end_weight is None else end_weight

    def release(self, group_id: Any) -> None:
        slot = self.find(group_id)
        if slot.ready:
            raise AssertionError(f"reference: release of ready group {group_id!r}")
        self.slots.remove(slot)

    def remove(self, group_ids: list[Any]) -> None:
        gone = set(group_ids)
        self.slots = [s for s in self.slots if s.group_id not in gone]

    # ------------------------------------------------------------- selection
    def floor(self, v: int) -> int:
        return max(0, v - self.window)

    def eligible(self, v: int) -> list[RefSlot]:
        """Ready slots ``select`` may take at ``v``, in the order it takes them."""
        ready = [s for s in self.slots if s.ready]
        lo = self.floor(v)
        if self.policy == "in_order":
            return [s for s in ready if s.target_step == v]
        if self.policy == "weight_fifo":
            # The oldest in-window weight over ALL slots: an unfinished group of
            # the oldest version holds back every newer version. By end_weight,
            # over the ready slots only: a group in flight generates with the
            # current weights, so it holds back no older version.
            pool = ready if self.staleness_of == "end_weight" else self.slots
            weights = [self.weight(s) for s in pool if lo <= self.weight(s) <= v]
            if not weights:
                return []
            oldest = min(weights)
            return [s for s in ready if self.weight(s) == oldest]
        if self.policy == "windowed":
            in_window = [s for s in ready if lo <= self.weight(s) <= v]
            if self.freshest_first:
                # sorted() is stable: equal lags keep dispatch order.
                in_window = sorted(in_window, key=lambda s: v - self.weight(s))
            return in_window
        return [s for s in ready if s.start_weight <= v]

    def select(self, v: int, min_groups: int, max_groups: int) -> list[RefSlot] | None:
        eligible = self.eligible(v)
        if len(eligible) < min_groups:
            return None
        taken = eligible[:max_groups]
        self.remove([s.group_id for s in taken])
        return taken

    def evictable(self, v: int) -> list[RefSlot]:
        if self.policy == "in_order":
            return [
                s for s in self.slots if s.ready and s.target_step is not None and s.target_step < v
            ]
        if self.policy in ("weight_fifo", "windowed"):
            return [s for s in self.slots if s.ready and self.weight(s) < self.floor(v)]
        return []

    def evict(self, v: int) -> list[RefSlot]:
        gone = self.evictable(v)
        self.remove([s.group_id for s in gone])
        return gone

    # --------------------------------------------------------- derived facts
    def should_abort_inflight(self, start_weight: int, v: int) -> bool:
        if self.staleness_of == "end_weight":
            return False
        if self.policy in ("weight_fifo", "windowed"):
            return start_weight < v - self.window
        return False

    @property
    def is_on_policy(self) -> bool:
        return self.window == 0

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        if self.policy == "windowed":
            return None
        return groups_per_step * (self.window + 1)

    def max_staleness(self) -> int | None:
        if self.staleness_of == "end_weight":
            return None
        if self.policy == "ready_first":
            return 0 if self.window == 0 else None
        return self.window

    def in_window(self, slot: Any, v: int) -> bool:
        """Whether a slot taken at ``v`` lies inside this policy's selection window."""
        if self.policy == "in_order":
            return slot.target_step == v
        if self.policy == "ready_first":
            return slot.start_weight <= v
        return self.floor(v) <= self.weight(slot) <= v
