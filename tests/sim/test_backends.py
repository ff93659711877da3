"""The simulated engine, trainer and task on their own, under virtual time."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.engines.base import RolloutEngine
from asyncrl.sim.backends import SimEngine, SimTask, SimTrainer
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import Constant, Lognormal
from asyncrl.tasks.base import Task
from asyncrl.trainers.base import Trainer
from asyncrl.types import (
    Completion,
    GenerationError,
    GenerationRequest,
    GroupAborted,
    GroupResult,
    Prompt,
    Rollout,
)
from tests.vtime import advance


def request(i: int, attempt: int = 1) -> GenerationRequest:
    return GenerationRequest(group_id=f"g{i}", prompt=Prompt(i, ""), num_generations=4,
                             attempt=attempt)


def test_backends_satisfy_the_protocols() -> None:
    assert isinstance(SimEngine(Constant(1.0), rollout_slots=1), RolloutEngine)
    assert isinstance(SimTrainer(train_step_s=1.0), Trainer)
    assert isinstance(SimTask(), Task)


def test_groups_beyond_the_slots_queue_in_dispatch_order() -> None:
    engine = SimEngine(Constant(5.0), rollout_slots=3)

    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        done: list[tuple[str, float]] = []

        async def one(i: int) -> None:
            result = await engine.generate(request(i))
            done.append((result.group_id, loop.time()))

        await asyncio.gather(*(one(i) for i in range(8)))
        return done

    done = run_virtual(main(), loop="jump")
    assert [t for _, t in done] == [5.0] * 3 + [10.0] * 3 + [15.0] * 2
    assert [g for g, _ in done] == [f"g{i}" for i in range(8)]
    assert engine.max_busy == 3
    assert engine.busy_slot_s == pytest.approx(40.0)
    assert engine.attempts == 8


def test_result_carries_rewards_and_weight_versions() -> None:
    engine = SimEngine(Constant(5.0), rollout_slots=1, weight_sync_s=1.0)

    async def main():
        gen = asyncio.ensure_future(engine.generate(request(0)))
        await advance(2.0)
        await engine.update_weights(None, 1)  # finishes at t=3, inside the generation
        return await gen

    result = run_virtual(main(), loop="jump")
    assert result.start_weight == 0 and result.end_weight == 1
    assert result.rewards is not None and len(result.rewards) == 4
    assert len(result.completion_ids) == len(result.behavior_logprobs) == 4


def test_weight_sync_takes_its_time_and_switches_the_version_at_the_end() -> None:
    engine = SimEngine(Constant(1.0), rollout_slots=1, weight_sync_s=2.5)

    async def main() -> tuple[int, float, int]:
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(engine.update_weights(None, 7))
        await advance(1.0)
        during = engine.weight_version
        await task
        return during, loop.time(), engine.weight_version

    assert run_virtual(main(), loop="jump") == (0, 2.5, 7)


def test_abort_stops_the_wait_and_frees_the_slot() -> None:
    engine = SimEngine(Constant(100.0), rollout_slots=1)

    async def main():
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate(request(0)))
        second = asyncio.ensure_future(engine.generate(request(1)))
        await advance(10.0)
        await engine.abort(["g0"])
        with pytest.raises(GroupAborted):
            await first
        aborted_at = loop.time()
        await second
        return aborted_at, loop.time()

    aborted_at, second_done = run_virtual(main(), loop="jump")
    assert aborted_at == 10.0
    assert second_done == 110.0  # the queued group got the slot at the abort
    assert engine.aborts == 1
    assert engine.busy_slot_s == pytest.approx(110.0)
    assert [i[2] for i in engine.intervals] == ["aborted", "ok"]


def test_abort_of_a_queued_group_never_takes_a_slot() -> None:
    engine = SimEngine(Constant(10.0), rollout_slots=1)

    async def main():
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate(request(0)))
        queued = asyncio.ensure_future(engine.generate(request(1)))
        await advance(1.0)
        await engine.abort(["g1"])
        await first
        with pytest.raises(GroupAborted):
            await queued
        return loop.time()

    assert run_virtual(main(), loop="jump") == 10.0
    assert engine.attempts == 1 and engine.busy_slot_s == pytest.approx(10.0)


def test_cancelling_a_generation_frees_its_slot() -> None:
    engine = SimEngine(Constant(50.0), rollout_slots=1)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate(request(0)))
        await advance(5.0)
        first.cancel()
        await engine.generate(request(1))
        return loop.time()

    assert run_virtual(main(), loop="jump") == 55.0


def test_cancelling_a_queued_generation_passes_its_turn_to_the_next() -> None:
    """A group cancelled while it waits for a slot never takes one: the freed
    slot starts the group behind it, at the instant it frees, and the fleet's
    pressure stops counting the cancelled one as waiting."""
    engine = SimEngine(Constant(10.0), rollout_slots=1)

    async def main() -> tuple[int, int, float]:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate(request(0)))
        gone = asyncio.ensure_future(engine.generate(request(1)))
        last = asyncio.ensure_future(engine.generate(request(2)))
        await advance(1.0)
        waiting = (await engine.pressure()).waiting
        gone.cancel()
        await asyncio.sleep(0)
        waiting_after = (await engine.pressure()).waiting
        await first
        await last
        return waiting, waiting_after, loop.time()

    assert run_virtual(main(), loop="jump") == (2, 1, 20.0)
    assert engine.attempts == 2 and engine.max_busy == 1
    assert [(t0, t1) for t0, t1, _ in engine.intervals] == [(0.0, 10.0), (10.0, 20.0)]


def test_a_queued_generation_closed_rather_than_cancelled_never_takes_a_slot() -> None:
    """A driver that closes the coroutine (GeneratorExit at its await) instead
    of cancelling its task: its place in the queue is given up all the same."""
    engine = SimEngine(Constant(5.0), rollout_slots=1)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        first = asyncio.ensure_future(engine.generate(request(0)))
        await asyncio.sleep(0)
        closed = engine.generate(request(1))
        closed.send(None)  # runs to its await: queued behind g0
        closed.close()
        await first
        await engine.generate(request(2))  # the slot g0 freed is free: no wait
        return loop.time()

    assert run_virtual(main(), loop="jump") == 10.0
    assert engine.attempts == 2 and engine._busy_now == 0 and not engine._running


class FailsToStart(Constant):
    """A latency model whose ``work`` raises for the next ``fails[0]`` groups
    that start: they cannot start (a bug in a custom model)."""

    def __init__(self, value: float) -> None:
        super().__init__(value)
        object.__setattr__(self, "fails", [0])

    def work(self, sample, busy, tokens_per_s):
        if self.fails[0]:
            self.fails[0] -= 1
            raise RuntimeError("the latency model failed")
        return super().work(sample, busy, tokens_per_s)


@pytest.mark.parametrize("where", ["queued", "fast path", "fleet resize"])
def test_a_group_that_fails_to_start_gets_the_error_and_the_slot_goes_on(where) -> None:
    """Starting a group can raise (a custom latency model): the error is that
    group's own generate call's, never the group whose end freed the slot, nor
    the fleet resize that added it; no slot is lost."""
    model = FailsToStart(5.0)
    fleet = [(1.0, 2)] if where == "fleet resize" else []
    engine = SimEngine(model, rollout_slots=1, fleet=fleet)
    resized: list[int] = []
    engine.on_resize.append(resized.append)

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        engine.schedule_fleet()
        outcomes: list[str] = []

        async def one(i: int) -> None:
            try:
                await engine.generate(request(i))
                outcomes.append(f"g{i} ok at {loop.time():g}")
            except RuntimeError as exc:
                outcomes.append(f"g{i} {exc} at {loop.time():g}")

        if where == "fast path":
            model.fails[0] = 1
            first = asyncio.ensure_future(one(0))
            await asyncio.sleep(0)
            await asyncio.gather(first, one(1))
            return outcomes
        tasks = [asyncio.ensure_future(one(i)) for i in range(3)]
        await asyncio.sleep(0)  # g0 runs, g1 and g2 queue
        model.fails[0] = 1  # the next start (g1's) raises
        await asyncio.gather(*tasks)
        return outcomes

    outcomes = run_virtual(main(), loop="jump")
    if where == "fast path":
        assert outcomes == ["g0 the latency model failed at 0", "g1 ok at 5"]
    elif where == "queued":  # g0's end hands g1 the slot; g1 fails, g2 takes it
        assert outcomes == ["g0 ok at 5", "g1 the latency model failed at 5", "g2 ok at 10"]
    else:  # the resize at t=1 adds a slot for g1, which fails; g2 takes it
        assert outcomes == ["g1 the latency model failed at 1", "g0 ok at 5", "g2 ok at 6"]
        assert resized == [2] and engine.rollout_slots == 2
    assert engine._busy_now == 0 and not engine._queued
    assert engine.attempts == len([o for o in outcomes if " ok " in o])


def test_failures_happen_after_the_latency_at_the_configured_rate() -> None:
    engine = SimEngine(Constant(2.0), rollout_slots=1000, failure_rate=0.3, seed=4)

    async def main() -> tuple[int, set[float]]:
        loop = asyncio.get_running_loop()
        failed, when = 0, set()

        async def one(i: int) -> None:
            nonlocal failed
            try:
                await engine.generate(request(i))
            except GenerationError:
                failed += 1
                when.add(loop.time())

        await asyncio.gather(*(one(i) for i in range(1000)))
        return failed, when

    failed, when = run_virtual(main(), loop="jump")
    assert failed == engine.failures
    assert 0.25 < failed / 1000 < 0.35
    assert when == {2.0}


def test_first_attempt_latency_belongs_to_the_prompt_whatever_the_order() -> None:
    model = Lognormal(10.0, 1.0)
    a = SimEngine(model, rollout_slots=8, seed=9)
    b = SimEngine(model, rollout_slots=8, seed=9)
    assert [a.first_attempt_latency(i) for i in range(5)] == [
        b.first_attempt_latency(i) for i in reversed(range(5))][::-1]
    assert a._draw(request(3))[0] == b.first_attempt_latency(3)
    # a retry draws from its own stream, so it does not shift the first attempts
    assert a._draw(request(3, attempt=2))[0] != a.first_attempt_latency(3)
    c = SimEngine(model, rollout_slots=8, seed=10)
    assert c.first_attempt_latency(0) != a.first_attempt_latency(0)


def rollout(i: int, *versions: int) -> Rollout:
    """A prompt group of two completions, one token per version given."""
    one = Completion.of([0] * len(versions), [0.0] * len(versions), versions, "stop")
    return Rollout(i, Prompt(i, ""), GroupResult(i, [0], [one, one], min(versions), [0.0, 0.0]),
                   [0.0, 0.0])


def test_trainer_takes_step_and_streaming_time() -> None:
    # 0.5 s per group and 0.25 s per completion token: 6 groups of 2 x 3 tokens.
    trainer = SimTrainer(train_step_s=4.0, train_per_group_s=0.5, train_per_token_s=0.25)

    async def main() -> float:
        loop = asyncio.get_running_loop()
        metrics = await trainer.train_chunk([rollout(i, 0, 0, 0) for i in range(6)], step=0)
        assert metrics["num_tokens"] == 36 and metrics["masked_token_frac"] == 0.0
        await trainer.finish_step(step=0)
        assert await trainer.get_weights() == 1
        return loop.time()

    assert run_virtual(main(), loop="jump") == 16.0
    assert trainer.busy_s == 16.0
    state = trainer.state_dict()
    fresh = SimTrainer(train_step_s=1.0)
    fresh.load_state_dict(state)
    assert fresh.steps == 1 and fresh.groups == 6


def test_task_prompts_are_an_endless_numbered_stream() -> None:
    source = SimTask().prompt_source(0)
    ids = [source.next_prompt().prompt_id for _ in range(5)]
    assert ids == [0, 1, 2, 3, 4]
    source.load_state_dict({"position": 100})
    assert source.next_prompt().prompt_id == 100


def test_first_attempt_failures_belong_to_the_prompt_too() -> None:
    a = SimEngine(Constant(1.0), rollout_slots=8, seed=2, failure_rate=0.5)
    b = SimEngine(Constant(1.0), rollout_slots=8, seed=2, failure_rate=0.5)
    forward = [a._draw(request(i))[1] for i in range(40)]
    backward = [b._draw(request(i))[1] for i in reversed(range(40))][::-1]
    assert forward == backward
    assert 5 < sum(forward) < 35
