"""ChangeSignal: the one primitive the runtime waits on (fire wakes the waiters
of that moment, once; later waiters wait for the next fire)."""

from __future__ import annotations

import asyncio
import contextlib

from asyncrl._util.change_signal import _PRUNE_AT, ChangeSignal
from tests.vtime import settle, virtual


@virtual
async def test_fire_wakes_every_waiter_of_that_moment_once_and_later_ones_wait() -> None:
    signal = ChangeSignal()
    woken: list[str] = []

    async def waiter(name: str, times: int) -> None:
        for _ in range(times):
            await signal.wait()
            woken.append(name)

    tasks = [asyncio.create_task(waiter("a", 1)), asyncio.create_task(waiter("b", 2))]
    await settle()
    assert woken == []
    signal.fire()
    await settle()
    assert woken == ["a", "b"]  # in the order they began to wait, once each
    assert tasks[0].done() and not tasks[1].done()  # b waits for the next fire
    signal.fire()
    await settle()
    assert woken == ["a", "b", "b"] and tasks[1].done()


@virtual
async def test_a_fire_with_nobody_waiting_is_not_remembered() -> None:
    signal = ChangeSignal()
    signal.fire()
    waiting = signal.wait()
    await settle()
    assert not waiting.done()
    signal.fire()
    await settle()
    assert waiting.done()


@virtual
async def test_a_cancelled_waiter_does_not_stop_the_others_waking() -> None:
    signal = ChangeSignal()

    async def waiter() -> None:
        await signal.wait()

    first, second = asyncio.create_task(waiter()), asyncio.create_task(waiter())
    await settle()
    first.cancel()
    await settle()
    signal.fire()
    await settle()
    assert first.cancelled()
    assert second.done() and not second.cancelled()


@virtual
async def test_waits_cancelled_over_and_over_without_a_fire_do_not_pile_up() -> None:
    # A task that waits with a timeout in a loop leaves a cancelled future each
    # time; the waiter list must stay bounded until the next fire.
    signal = ChangeSignal()
    for _ in range(10 * _PRUNE_AT):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signal.wait(), timeout=1.0)
    assert len(signal._waiters or []) <= _PRUNE_AT
    live = asyncio.create_task(asyncio.wait_for(signal.wait(), timeout=5.0))
    await settle()
    signal.fire()
    await live  # the live waiter wakes on the fire, not by its timeout


@virtual
async def test_many_live_waiters_and_cancelled_ones_keep_the_list_bounded() -> None:
    # Pruning must not rescan a long list of live waiters at every join (the
    # threshold doubles), and must still drop the cancelled ones.
    signal = ChangeSignal()
    live = [asyncio.create_task(_wait(signal)) for _ in range(100)]
    await settle()
    most = 0
    for _ in range(1000):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(signal.wait(), timeout=1.0)
        most = max(most, len(signal._waiters or []))
    assert most <= 2 * (len(live) + 1)
    signal.fire()
    await settle()
    assert all(task.done() and not task.cancelled() for task in live)


async def _wait(signal: ChangeSignal) -> None:
    await signal.wait()
