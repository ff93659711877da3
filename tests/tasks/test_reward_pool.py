"""The reward pool: results, failures, timeouts of hung threads and processes.

Timing runs under virtual time (the jump loop, whose clock does not wait for
worker threads while a timer is pending: a hanging reward reaches its timeout
at once). Rewards block on events the test controls, never on a clock. For
the same reason a call that should succeed runs with ``timeout_s = None``:
under the jump loop it would reach its timeout before its thread returns.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tests.vtime import advance

from asyncrl.config import ArithmeticTaskConfig
from asyncrl.errors import RewardError
from asyncrl.sim.clock import run_virtual
from asyncrl.tasks import ArithmeticTask, Scorer, build_scorer
from asyncrl.tasks.rewards import RecordReward, RewardPool
from asyncrl.types import Prompt

HERE = Path(__file__).resolve().parent


@pytest.fixture(autouse=True)
def reward_fns(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(HERE))
    import reward_fns

    reward_fns.RELEASE.clear()
    yield reward_fns
    reward_fns.RELEASE.set()  # let any thread still blocked finish


def pool_of(name: str, **kw: Any) -> RewardPool:
    import reward_fns

    return RewardPool(RecordReward(getattr(reward_fns, name)), **kw)


PROMPT = Prompt(7, "2+2=", "4", {"record": {"level": 2}})


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until a worker thread made ``condition`` true. A zero
    sleep keeps a callback ready, so the virtual clock cannot jump meanwhile."""
    while not condition():
        await asyncio.sleep(0)


# ---------------------------------------------------------------- contract
@pytest.mark.parametrize("executor", ["thread", pytest.param("process", marks=pytest.mark.e2e)])
def test_scores_failures_and_recovery(executor: str) -> None:
    async def main() -> None:
        pool = pool_of("graded", executor=executor, num_workers=2)
        assert isinstance(pool, Scorer)
        assert await pool.score(PROMPT, ["4", "5", " 4 "]) == [1.0, 0.5, 1.0]
        bad = pool_of("raises_on_x", executor=executor)
        with pytest.raises(RewardError, match=r"prompt 7: completion 1: reward_fns:raises_on_x "
                                              r"raised ValueError: cannot score 'x'"):
            await bad.score(PROMPT, ["a", "x", "b"])
        assert await bad.score(PROMPT, ["a", "b"]) == [1.0, 1.0]  # the pool goes on
        # A prompt that says where it came from (a dataset's) is named by it too.
        located = Prompt(7, "2+2=", "4", {"record": {}, "source": "data/train.jsonl line 8"})
        with pytest.raises(RewardError, match=r"^prompt 7 \(data/train.jsonl line 8\): "
                                              r"completion 1: reward_fns:raises_on_x raised"):
            await bad.score(located, ["a", "x"])
        await bad.close()
        for name, message in (("not_a_number", "returned 'high', not a number"),
                              ("a_numeric_string", "returned '1', not a number"),
                              ("not_finite", "returned nan; return a finite float")):
            odd = pool_of(name, executor=executor)
            with pytest.raises(RewardError, match=f"completion 0: .*{message}"):
                await odd.score(PROMPT, ["a"])
            await odd.close()
        async_pool = pool_of("graded_async", executor=executor)
        assert await async_pool.score(PROMPT, ["4", "3"]) == [1.0, 0.0]
        await async_pool.close()
        await pool.close()
        with pytest.raises(RewardError, match="closed"):
            await pool.score(PROMPT, ["4"])

    asyncio.run(main())


def test_build_scorer_defaults_for_a_built_in_task() -> None:
    task = ArithmeticTask(ArithmeticTaskConfig())
    pool = build_scorer(task, task.cfg)
    assert (pool.executor, pool.num_workers, pool.timeout_s) == ("thread", 4, 30.0)
    prompt = task.prompt_source(0).next_prompt()
    texts = [prompt.answer, "0", prompt.answer + "9"]

    async def main() -> list[float]:
        try:
            return await pool.score(prompt, texts)
        finally:
            await pool.close()

    assert asyncio.run(main()) == [task.reward(prompt, t) for t in texts]


# ---------------------------------------------------------------- threads
def test_a_hung_thread_times_out_at_timeout_s_and_is_abandoned() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = pool_of("hangs_on_h", timeout_s=5.0, num_workers=2)
        with pytest.raises(RewardError, match=r"prompt 7: .*hangs_on_h timed out: a call ran "
                                              r"longer than task.reward.timeout_s=5s"):
            await pool.score(PROMPT, ["a", "h", "b"])
        assert loop.time() == 5.0 and pool.hung == 1 and pool.timeouts == 1
        pool.timeout_s = None
        assert await pool.score(PROMPT, ["a", "b"]) == [1.0, 1.0]  # a new thread serves it
        assert pool._threads.num_threads == 2
        pool.timeout_s = 5.0
        with pytest.raises(RewardError, match="timed out"):
            await pool.score(PROMPT, ["h"])
        assert loop.time() == 10.0 and pool.hung == 2
        # As many abandoned calls as workers: refuse at once, and say what to do.
        with pytest.raises(RewardError, match=r"every worker of .*num_workers=2\) is held by a call that timed out.*"
                                              "executor: process"):
            await pool.score(PROMPT, ["a"])
        import reward_fns

        reward_fns.RELEASE.set()  # the hung calls return at last: their threads come back
        await until(lambda: pool.hung == 0)
        pool.timeout_s = None
        assert await pool.score(PROMPT, ["a"]) == [1.0]
        await pool.close()

    run_virtual(main(), loop="jump")


def test_the_timeout_restarts_with_every_call_of_a_group(reward_fns: Any) -> None:
    gate, started = threading.Event(), []

    def second_hangs(prompt: Prompt, completion: str) -> float:
        started.append(completion)
        if completion == "first":
            gate.wait()
        else:
            reward_fns.RELEASE.wait()  # until the test is over
        return 1.0

    async def main() -> float:
        loop = asyncio.get_running_loop()
        pool = RewardPool(second_hangs, timeout_s=10.0)
        job = asyncio.ensure_future(pool.score(PROMPT, ["first", "second"]))
        await until(lambda: started == ["first"])
        await advance(6.0)                # the first call runs 6 s (of its 10)
        gate.set()
        await until(lambda: started == ["first", "second"])
        with pytest.raises(RewardError, match="timed out"):
            await job
        return loop.time()

    # The second call started at 6 s: it times out at 16 s, not at 10 s.
    assert run_virtual(main(), loop="jump") == 16.0


def test_a_hanging_reward_blocks_neither_the_loop_nor_other_groups() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = pool_of("hangs_on_h", timeout_s=None, num_workers=2)
        hung = asyncio.ensure_future(pool.score(PROMPT, ["h"]))
        await advance(100.0)  # the event loop's clock and timers run on
        assert loop.time() == 100.0 and not hung.done()
        assert await pool.score(PROMPT, ["a", "b"]) == [1.0, 1.0]  # the second worker
        import reward_fns

        reward_fns.RELEASE.set()
        assert await hung == [1.0]
        await pool.close()

    run_virtual(main(), loop="jump")


def test_at_most_num_workers_groups_run_and_cancelled_waiters_free_their_slot() -> None:
    gate = threading.Event()
    active, peak = [0], [0]
    lock = threading.Lock()

    def counted(prompt: Prompt, completion: str) -> float:
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        gate.wait()
        with lock:
            active[0] -= 1
        return 1.0

    async def main() -> None:
        pool = RewardPool(counted, num_workers=2, timeout_s=None)
        jobs = [asyncio.ensure_future(pool.score(PROMPT, ["a"])) for _ in range(6)]
        await until(lambda: active[0] == 2)
        jobs[5].cancel()  # still waiting for a worker
        gate.set()
        results = await asyncio.gather(*jobs[:5])
        assert results == [[1.0]] * 5 and jobs[5].cancelled()
        assert peak[0] == 2
        assert await pool.score(PROMPT, ["a", "b"]) == [1.0, 1.0]
        await pool.close()

    run_virtual(main(), loop="jump")


# -------------------------------------------------------------- processes
@pytest.mark.e2e
def test_a_hung_process_is_killed_and_replaced() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        pool = pool_of("sleeps_on_h", executor="process", timeout_s=5.0, num_workers=1)
        with pytest.raises(RewardError, match="timed out"):
            await pool.score(PROMPT, ["a", "h"])
        assert loop.time() == 5.0 and pool.timeouts == 1 and pool.hung == 0
        await until(lambda: pool._processes.killed == 1)
        pool.timeout_s = None
        assert await pool.score(PROMPT, ["a", "b"]) == [1.0, 1.0]  # a fresh process
        await pool.close()

    run_virtual(main(), loop="jump")


@pytest.mark.e2e
def test_a_process_that_dies_fails_its_group_only() -> None:
    async def main() -> None:
        pid_pool = pool_of("pid", executor="process", num_workers=1)
        first = await pid_pool.score(PROMPT, ["a"])
        assert await pid_pool.score(PROMPT, ["a"]) == first  # the process is reused
        await pid_pool.close()
        pool = pool_of("dies_on_d", executor="process", num_workers=1)
        with pytest.raises(RewardError, match=r"worker process died \(exit code 3\)"):
            await pool.score(PROMPT, ["d"])
        assert await pool.score(PROMPT, ["a"]) == [1.0]
        await pool.close()

    asyncio.run(main())
