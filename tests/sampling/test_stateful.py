"""Stateful checks: each built-in policy against the linear-scan reference model.

Hypothesis drives random interleavings of what the two pumps and the engines
do (admit, reserve, out-of-order commit, release, evict, select with random
bounds, version advances and aborts) on our buffer+sampler and on the
reference model, and compares them after every step: same groups selected in
the same order, same evictions, same stamps, same gate decisions.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from asyncrl import TrainerVersion
from asyncrl.sim.clock import JumpClockLoop

from .helpers import VARIANTS, describe, make_twins, variant_id

CAPACITY = 10
SETTINGS = settings(
    max_examples=30,
    stateful_step_count=35,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


class _SamplerMachine(RuleBasedStateMachine):
    """Our sampler and the reference, driven in lock-step. Subclassed per variant."""

    variant: tuple[str, int, bool] = ("in_order", 1, False)

    def __init__(self) -> None:
        super().__init__()
        # Each example gets its own loop: the buffer's events bind to it on first use.
        self.loop = JumpClockLoop()
        self.buf, self.sampler, self.ref = make_twins(self.variant, capacity=CAPACITY)
        self.version = TrainerVersion(0)
        self.next_id = 0

    def teardown(self) -> None:
        self.loop.close()

    # ------------------------------------------------------------- helpers
    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return self.loop.run_until_complete(coro)

    def probe(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Start ``coro`` and run the loop until every task is blocked; return its
        (maybe pending) task."""

        async def go() -> asyncio.Future[Any]:
            task = asyncio.ensure_future(coro)
            await self.loop.settled()  # until it returned or blocked
            return task

        return self.run(go())

    def cancel(self, task: asyncio.Future[Any]) -> None:
        task.cancel()

        async def settle() -> None:
            await self.loop.settled()

        self.run(settle())
        assert task.cancelled()

    def unready(self) -> list[Any]:
        return [s.group_id for s in self.ref.slots if not s.ready]

    @property
    def v(self) -> int:
        return self.version.value

    # --------------------------------------------------------------- rules
    @initialize(data=st.data())
    def start_mid_run(self, data: st.DataObject) -> None:
        """Start from a resumed-looking state: some version, dispatch index and full-ish buffer."""
        v0 = data.draw(st.integers(0, 5), label="v0")
        self.version.set(v0)
        d0 = data.draw(st.integers(0, v0 + self.ref.window + 1), label="d0")
        self.sampler.set_dispatch_index(d0)
        self.ref.dispatch_index = d0
        for _ in range(data.draw(st.integers(0, CAPACITY), label="slots")):
            gid = f"g{self.next_id}"
            self.next_id += 1
            weight = data.draw(st.integers(max(0, v0 - 3), v0), label="start_weight")
            target = None
            if self.ref.policy == "in_order":
                target = data.draw(st.integers(max(0, v0 - 1), v0 + 2), label="target_step")
            self.buf.reserve_nowait(gid, start_weight=weight, target_step=target)
            self.ref.reserve(gid, weight, target)
            if data.draw(st.booleans(), label="ready"):
                self.buf.commit(gid, payload=gid, end_weight=weight)
                self.ref.commit(gid, payload=gid, end_weight=weight)

    @rule()
    def admit(self) -> None:
        task = self.probe(self.sampler.admit(trainer_version=self.version))
        if self.ref.may_admit(self.v):
            assert task.done(), f"admit blocked at d={self.ref.dispatch_index}, v={self.v}"
            assert task.result() == self.ref.admit(self.v)
        else:
            assert not task.done(), f"admit passed at d={self.ref.dispatch_index}, v={self.v}"
            self.cancel(task)

    @rule(data=st.data(), size=st.integers(1, 4))
    def reserve_batch(self, data: st.DataObject, size: int) -> None:
        """Reserve a dispatch batch: ``size`` groups sharing a start weight (and stamp)."""
        # Weights from below the window up to the current version.
        weight = data.draw(st.integers(max(0, self.v - 4), self.v), label="start_weight")
        target = None
        if self.ref.policy == "in_order":
            target = data.draw(
                st.integers(max(0, self.v - 2), self.v + self.ref.window + 1), label="target_step"
            )
        for _ in range(size):
            gid = f"g{self.next_id}"
            task = self.probe(self.buf.reserve(gid, start_weight=weight, target_step=target))
            if self.ref.is_full():
                assert not task.done(), "reserve must wait while the buffer is full"
                self.cancel(task)
                return
            assert task.done() and task.result().group_id == gid
            self.ref.reserve(gid, weight, target)
            self.next_id += 1

    @precondition(lambda self: self.unready())
    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        """Commit a few in-flight groups, in any order (generation times differ)."""
        pending = self.unready()
        count = data.draw(st.integers(1, len(pending)), label="count")
        for gid in data.draw(st.permutations(pending), label="order")[:count]:
            end = self.ref.find(gid).start_weight + data.draw(st.integers(0, 2), label="lag")
            self.buf.commit(gid, payload=gid, end_weight=end)
            self.ref.commit(gid, payload=gid, end_weight=end)

    @precondition(lambda self: self.unready())
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        gid = data.draw(st.sampled_from(self.unready()), label="release")
        self.buf.release(gid)
        self.ref.release(gid)

    @rule(lo=st.integers(1, 4), extra=st.integers(0, 3))
    def select(self, lo: int, extra: int) -> None:
        ours = self.run(
            self.sampler.select(
                current_train_weight=self.v, min_prompt_groups=lo, max_prompt_groups=lo + extra
            )
        )
        theirs = self.ref.select(self.v, lo, lo + extra)
        if theirs is None:
            assert ours is None
        else:
            assert ours is not None
            assert [s.group_id for s in ours] == [s.group_id for s in theirs]

    @rule()
    def evict(self) -> None:
        count = self.run(self.sampler.evict(current_train_weight=self.v))
        assert count == len(self.ref.evict(self.v))

    @rule(step=st.integers(1, 2), abort=st.booleans())
    def advance(self, step: int, abort: bool) -> None:
        self.version.set(self.v + step)
        for gid in self.unready():
            start = self.ref.find(gid).start_weight
            ours = self.sampler.should_abort_inflight(
                start_weight_version=start, current_train_weight=self.v
            )
            assert ours == self.ref.should_abort_inflight(start, self.v), (gid, start, self.v)
            if ours and abort:
                self.buf.release(gid)
                self.ref.release(gid)

    # ---------------------------------------------------------- invariants
    @invariant()
    def same_slots(self) -> None:
        assert describe(self.buf.slots()) == describe(self.ref.slots)

    @invariant()
    def sizes_consistent(self) -> None:
        assert len(self.buf) <= self.buf.capacity
        ready = sum(1 for s in self.buf.slots() if s.ready)
        assert self.buf.ready_count == ready == self.ref.ready_count
        assert self.buf.reserved_count == len(self.buf) - ready

    @invariant()
    def same_dispatch_index(self) -> None:
        assert self.sampler.dispatch_index == self.ref.dispatch_index


@pytest.mark.parametrize("variant", VARIANTS, ids=[variant_id(v) for v in VARIANTS])
def test_policy_matches_reference(variant: tuple[str, int, bool]) -> None:
    machine = type(f"Machine_{variant_id(variant)}", (_SamplerMachine,), {"variant": variant})
    run_state_machine_as_test(machine, settings=SETTINGS)
