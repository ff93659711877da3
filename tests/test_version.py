"""TrainerVersion: the event-driven counter that admission waits on."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl import TrainerVersion
from tests.vtime import settle, virtual


def test_starts_at_given_value_and_rejects_negative() -> None:
    assert TrainerVersion().value == 0
    assert TrainerVersion(3).value == 3
    with pytest.raises(ValueError, match=">= 0"):
        TrainerVersion(-1)


def test_only_moves_forward() -> None:
    version = TrainerVersion(2)
    version.set(2)
    version.set(5)
    assert version.value == 5
    with pytest.raises(ValueError, match=r"only increase \(current 5, asked 4\)"):
        version.set(4)
    assert version.value == 5


@virtual
async def test_wait_until_returns_immediately_when_predicate_holds() -> None:
    version = TrainerVersion(3)
    # Awaited directly: if it suspended, nothing would ever wake it.
    assert await version.wait_until(lambda v: v >= 3) == 3
    assert await version.wait_until(lambda v: v == 3) == 3


@virtual
async def test_wait_until_wakes_on_change_and_returns_the_satisfying_value() -> None:
    version = TrainerVersion()
    waiter = asyncio.create_task(version.wait_until(lambda v: v >= 2))
    await settle()
    assert not waiter.done()

    version.set(1)  # a change that does not satisfy the predicate: keeps waiting
    await settle()
    assert not waiter.done()

    version.set(3)
    await settle()
    assert waiter.done()
    assert waiter.result() == 3


@virtual
async def test_setting_the_same_value_does_not_wake_anyone() -> None:
    version = TrainerVersion(1)
    calls: list[int] = []

    def predicate(v: int) -> bool:
        calls.append(v)
        return v >= 2

    waiter = asyncio.create_task(version.wait_until(predicate))
    await settle()
    assert calls == [1]
    version.set(1)
    await settle()
    # No re-evaluation: a set() that changes nothing fires no signal.
    assert calls == [1]
    version.set(2)
    await settle()
    assert calls == [1, 2]
    assert waiter.result() == 2


@virtual
async def test_one_change_wakes_every_waiter() -> None:
    version = TrainerVersion()
    waiters = [asyncio.create_task(version.wait_until(lambda v, k=k: v >= k)) for k in (1, 1, 2)]
    await settle()
    assert not any(w.done() for w in waiters)

    version.set(1)
    await settle()
    assert [w.done() for w in waiters] == [True, True, False]

    version.set(2)
    await settle()
    assert all(w.done() for w in waiters)


@virtual
async def test_a_cancelled_waiter_does_not_disturb_the_others() -> None:
    version = TrainerVersion()
    gone = asyncio.create_task(version.wait_until(lambda v: v >= 1))
    kept = asyncio.create_task(version.wait_until(lambda v: v >= 1))
    await settle()
    gone.cancel()
    await settle()
    version.set(1)
    await settle()
    assert gone.cancelled()
    assert kept.result() == 1


def test_repr_shows_the_value() -> None:
    assert repr(TrainerVersion(7)) == "TrainerVersion(7)"
