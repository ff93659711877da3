"""Rewards off the event loop, as the controller sees them (virtual time).

A slow reward delays only its own group; a raising reward fails its group
through the retry path (recorded, replaced) and the run finishes; a reward that
hangs hits ``timeout_s`` in the real reward pool.
"""

from __future__ import annotations

import threading

from asyncrl.sim.clock import run_virtual
from asyncrl.tasks.rewards import RewardPool
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

N = 4  # groups per step


def _time_version_sets(ctl) -> dict[int, float]:
    times = {0: 0.0}
    plain = ctl.version.set

    def timed(value: int) -> None:
        times[value] = ctl.ctx.now()
        plain(value)

    ctl.version.set = timed
    return times


def test_a_reward_slower_than_a_step_does_not_delay_admission() -> None:
    task = FakeTask()
    s = 2
    ctl = make_controller({"name": "ready_first", "max_staleness_versions": s},
                          engines=[FakeEngine(1.0)], trainer=FakeTrainer(step_time=1.0),
                          task=task, scorer=InlineScorer(task, delay=50.0), steps=8,
                          per_step=N, capacity=N * (s + 1), inflight=64)
    set_at = _time_version_sets(ctl)
    result = run_virtual(ctl.run())
    assert result.steps == 8
    first_dispatch = {}
    for rec in ctl.ledger.records():
        batch = rec.prompt_id // N
        first_dispatch[batch] = min(first_dispatch.get(batch, 1e18), rec.dispatch_time)
    # Batch d goes the moment the gate opens (version d - s), while the rewards of
    # earlier groups are still being computed 50 s at a time.
    for d in range(s, 8):
        assert first_dispatch[d] == set_at[d - s], d
    assert max(set_at[v] - set_at[v - 1] for v in range(1, 9)) >= 50.0


def test_a_reward_that_raises_fails_its_groups_and_the_run_finishes() -> None:
    task = FakeTask()
    scorer = InlineScorer(task, fail=lambda p: p.prompt_id % 5 == 0)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1}, task=task,
                          scorer=scorer, steps=10, per_step=N,
                          rollout_failure={"max_skipped_prompts": 100,
                                           "on_dropped_prompt": "replace",
                                           "max_replacement_attempts": 5})
    result = run_virtual(ctl.run())
    assert result.steps == 10 and result.summary["ledger"]["balanced"]
    failed = [r for r in ctl.ledger.records() if r.state == "failed"]
    assert failed and all(r.prompt_id % 5 == 0 for r in failed)
    assert all(r.attempts == 2 and "injected reward failure" in r.error for r in failed)
    assert result.summary["ledger"]["trained"] == 10 * N  # replacements filled every step


class HangingTask(FakeTask):
    """The reward of prompt 3 never returns (until the test releases it)."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()

    def reward(self, prompt, completion) -> float:
        if prompt.prompt_id == 3:
            self.release.wait()
        return super().reward(prompt, completion)


def test_a_reward_that_hangs_hits_its_timeout() -> None:
    task = HangingTask()
    pool = RewardPool(task.reward, num_workers=4, executor="thread", timeout_s=5.0)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1}, task=task,
                          scorer=pool, steps=6, per_step=N,
                          rollout_failure={"max_consecutive_dropped_prompts": 1,
                                           "max_infra_attempts_per_prompt": 2,
                                           "backoff_base_s": 0.5,
                                           "on_dropped_prompt": "replace"})
    try:
        # The jump loop holds the clock while a reward thread works, until it has
        # run for THREAD_GRACE_S real seconds: then the 5 s (virtual) timeout fires.
        result = run_virtual(ctl.run(), loop="jump")
    finally:
        task.release.set()  # let the abandoned worker threads end
        run_virtual(pool.close(), loop="jump")
    assert result.steps == 6 and result.summary["ledger"]["balanced"]
    (hung,) = [r for r in ctl.ledger.records() if r.state == "failed"]
    assert hung.prompt_id == 3 and hung.attempts == 2 and "5" in hung.error


def test_rewards_that_are_not_numbers_fail_the_group_with_the_fix() -> None:
    import numpy as np
    import pytest
    import torch

    from asyncrl.controller.attempts import _checked_rewards
    from asyncrl.errors import RewardError
    from asyncrl.types import Completion, GroupResult

    result = GroupResult("g", [0], [Completion.of([t], [0.0], 0, "stop", text)
                                    for t, text in ((1, "a"), (2, "b"))], start_weight=0)
    assert _checked_rewards([np.float32(0.5), torch.tensor(1.0)], result) == [0.5, 1.0]
    for bad, says in ((["1", 0.0], r"'1' \(str\) is not a number"),
                      ([float("nan"), 0.0], "nan is not a finite number"),
                      ([1.0], "got 1 reward for 2 completions")):
        with pytest.raises(RewardError, match=says):
            _checked_rewards(bad, result)


class NanRewards(FakeEngine):
    """Returns its groups with rewards of its own, all nan."""

    async def generate(self, request):
        result = await super().generate(request)
        result.rewards = [float("nan")] * request.num_generations
        return result


def test_non_finite_rewards_an_engine_returns_name_the_engine() -> None:
    """Rewards that came with the group (GroupResult.rewards) are the engine's:
    the error names it, and the fix is not the reward function's."""
    import pytest

    from asyncrl.errors import TooManyFailedGroups

    ctl = make_controller({"name": "in_order"}, engines=[NanRewards()], steps=2)
    with pytest.raises(TooManyFailedGroups) as err:
        run_virtual(ctl.run())
    text = str(err.value)
    assert ("EngineRewardError: engine 0 (tests.controller.test_rewards.NanRewards) returned "
            "rewards with the group: reward nan is not a finite number") in text
    assert "Fix the rollout function or engine the error names" in text
    assert "Fix the reward function" not in text
