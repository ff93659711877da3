"""Admission: the gate each policy puts on the rollout pump, and the dispatch index.

Everything runs on the event loop with ``asyncio.sleep(0)`` yields only: a
blocked ``admit`` is a task that stays pending however often the loop turns,
and it must finish right after ``TrainerVersion.set`` opens its gate.
"""

from __future__ import annotations

import asyncio

import pytest

from asyncrl import TrainerVersion
from asyncrl.buffer import RolloutBuffer
from asyncrl.sampling import BaseSampler, create_sampler
from tests.vtime import settle, virtual

from .helpers import make_twins

GATED = ["in_order", "weight_fifo", "ready_first"]
KNOB = {
    "in_order": "max_lookahead_versions",
    "weight_fifo": "max_staleness_versions",
    "windowed": "max_staleness_versions",
    "ready_first": "max_staleness_versions",
}


def _sampler(policy: str, window: int) -> BaseSampler:
    sampler = create_sampler(RolloutBuffer(8), {"name": policy, KNOB[policy]: window})
    assert isinstance(sampler, BaseSampler)
    return sampler


async def _admit_task(sampler: BaseSampler, version: TrainerVersion) -> asyncio.Task[int | None]:
    task = asyncio.ensure_future(sampler.admit(trainer_version=version))
    await settle()
    return task


@pytest.mark.parametrize("policy", GATED)
@pytest.mark.parametrize("window", [0, 1, 2])
@virtual
async def test_gated_policy_blocks_at_the_bound_and_releases_on_advance(
    policy: str, window: int
) -> None:
    sampler = _sampler(policy, window)
    version = TrainerVersion(0)

    # At v = 0 the batches d = 0 .. s may go at once.
    for d in range(window + 1):
        task = await _admit_task(sampler, version)
        assert task.done(), f"batch {d} should be admitted at v=0 with s={window}"
        assert task.result() == (d if policy == "in_order" else None)
    assert sampler.dispatch_index == window + 1

    # Batch d = s + 1 waits for v = 1.
    blocked = await _admit_task(sampler, version)
    assert not blocked.done()
    version.set(0)  # no change, no wake-up
    await settle()
    assert not blocked.done()
    assert sampler.dispatch_index == window + 1, "a waiting batch must not take its index yet"

    version.set(1)
    await settle()
    assert blocked.done()
    assert blocked.result() == (window + 1 if policy == "in_order" else None)
    assert sampler.dispatch_index == window + 2


@pytest.mark.parametrize("policy", GATED)
@virtual
async def test_queued_batches_are_released_one_version_at_a_time(policy: str) -> None:
    sampler = _sampler(policy, 1)
    version = TrainerVersion(0)
    for _ in range(2):  # d = 0, 1 go at v = 0
        await sampler.admit(trainer_version=version)

    second = await _admit_task(sampler, version)  # d = 2 needs v >= 1
    third = await _admit_task(sampler, version)  # d = 3 needs v >= 2
    assert not second.done() and not third.done()

    version.set(1)
    await settle()
    assert second.done() and not third.done()

    version.set(2)
    await settle()
    assert third.done()
    if policy == "in_order":
        assert (second.result(), third.result()) == (2, 3)


@pytest.mark.parametrize("policy", GATED)
@virtual
async def test_a_jump_in_version_releases_every_batch_it_allows(policy: str) -> None:
    sampler = _sampler(policy, 0)
    version = TrainerVersion(0)
    await sampler.admit(trainer_version=version)  # d = 0
    waiting = [await _admit_task(sampler, version) for _ in range(3)]  # d = 1, 2, 3
    assert not any(t.done() for t in waiting)
    version.set(2)
    await settle()
    assert [t.done() for t in waiting] == [True, True, False]


@pytest.mark.parametrize("window", [0, 1, 3])
@virtual
async def test_windowed_never_blocks(window: int) -> None:
    sampler = _sampler("windowed", window)
    version = TrainerVersion(0)
    for _ in range(50):
        # Awaited directly: a gate would hang the test here.
        assert await sampler.admit(trainer_version=version) is None
    assert sampler.dispatch_index == 50


@pytest.mark.parametrize("window", [0, 1, 2])
@virtual
async def test_in_order_stamps_consecutive_target_steps(window: int) -> None:
    sampler = _sampler("in_order", window)
    version = TrainerVersion(0)
    stamps = []
    for step in range(6):
        # The pump admits as far ahead as the gate allows, then the trainer steps.
        while True:
            task = await _admit_task(sampler, version)
            if not task.done():
                break
            stamps.append(task.result())
        assert stamps[-1] == step + window
        version.set(step + 1)
        await settle()
        assert task.done()
        stamps.append(task.result())
    assert stamps == list(range(len(stamps)))


@pytest.mark.parametrize("policy", ["in_order", "weight_fifo", "windowed", "ready_first"])
@pytest.mark.parametrize("window", [0, 2])
@virtual
async def test_gate_matches_the_reference_on_a_grid(policy: str, window: int) -> None:
    for d in range(7):
        for v in range(7):
            _, sampler, ref = make_twins((policy, window, False), capacity=4)
            sampler.set_dispatch_index(d)
            ref.dispatch_index = d
            task = await _admit_task(sampler, TrainerVersion(v))
            assert task.done() == ref.may_admit(v), (d, v)
            if task.done():
                assert task.result() == ref.admit(v)
            else:
                task.cancel()
                await settle()
                assert sampler.dispatch_index == d, "a cancelled admit must not use up an index"


@pytest.mark.parametrize("policy", GATED)
@pytest.mark.parametrize("k", [1, 5])
@virtual
async def test_set_dispatch_index_resumes_like_step_k_of_a_fresh_run(policy: str, k: int) -> None:
    sampler = _sampler(policy, 0)
    sampler.set_dispatch_index(k)
    assert sampler.dispatch_index == k

    early = await _admit_task(sampler, TrainerVersion(k - 1))
    assert not early.done(), "with s=0, batch k must wait for trainer version k"
    early.cancel()
    await settle()

    task = await _admit_task(sampler, TrainerVersion(k))
    assert task.done()
    assert task.result() == (k if policy == "in_order" else None)
    assert sampler.dispatch_index == k + 1


def test_set_dispatch_index_rejects_negative() -> None:
    with pytest.raises(ValueError, match="dispatch index must be >= 0"):
        _sampler("in_order", 1).set_dispatch_index(-1)


@pytest.mark.parametrize("policy", ["in_order", "weight_fifo", "windowed", "ready_first"])
@virtual
async def test_state_dict_round_trip_restores_the_dispatch_index(policy: str) -> None:
    version = TrainerVersion(10)
    original = _sampler(policy, 1)
    for _ in range(3):
        await original.admit(trainer_version=version)
    state = original.state_dict()
    assert state["dispatch_index"] == 3

    restored = _sampler(policy, 1)
    restored.load_state_dict(state)
    assert restored.dispatch_index == 3
    stamp = await restored.admit(trainer_version=version)
    assert stamp == (3 if policy == "in_order" else None)
    assert restored.dispatch_index == 4


@pytest.mark.parametrize("bad", [{}, {"dispatch_index": "x"}, {"dispatch_index": None}])
def test_load_state_dict_rejects_malformed_state(bad: dict) -> None:
    with pytest.raises(ValueError, match="'dispatch_index'"):
        _sampler("in_order", 1).load_state_dict(bad)
