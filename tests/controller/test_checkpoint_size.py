"""A checkpoint holds the live groups only: its size does not grow with the run.

Virtual time and the simulator's backends: a 10,000-step run and a 100-step run
with the same settings, their controller state taken at the end of each.
"""

from __future__ import annotations

import json

from asyncrl.config import AsyncRLConfig, GRPOConfig, LognormalLatency
from asyncrl.controller import Controller, MemoryHistory
from asyncrl.sim.backends import SimEngine, SimTask, SimTrainer
from asyncrl.sim.clock import run_virtual
from asyncrl.sim.latency import make_latency_model
from tests.controller.conftest import FORGIVING


def checkpoint_after(steps: int) -> tuple[dict, int]:
    history = MemoryHistory()

    async def main() -> dict:
        engine = SimEngine(make_latency_model(LognormalLatency(median=3.0, sigma=0.8)),
                           rollout_slots=8, seed=1, failure_rate=0.05)
        ctl = Controller(
            task=SimTask(), engines=[engine], trainer=SimTrainer(train_step_s=1.0),
            grpo=GRPOConfig(num_prompts_per_step=2, num_generations_per_prompt=4,
                            max_num_steps=steps),
            async_rl=AsyncRLConfig(sampler={"name": "windowed", "max_staleness_versions": 2},
                                   max_buffered_rollouts=8, min_groups_for_streaming_train=1,
                                   max_inflight_prompts=8,
                                   rollout_failure=FORGIVING),
            ledger_history=history,
        )
        await ctl.run()
        return ctl.state_dict()

    state = run_virtual(main(), loop="jump")
    return state, len(history.records)


def test_checkpoint_size_does_not_grow_with_the_length_of_the_run() -> None:
    short, short_finished = checkpoint_after(100)
    long, long_finished = checkpoint_after(10_000)
    assert long_finished > 90 * short_finished  # the long run really ended ~100x more groups
    # Live groups only: at most the buffer and the groups in flight.
    assert len(long["ledger"]["live"]) <= 8 + 8
    assert long["ledger"]["counts"]["trained"] == 10_000 * 2
    short_bytes, long_bytes = len(json.dumps(short)), len(json.dumps(long))
    # Equal up to the width of the numbers (ids and counters have more digits).
    assert long_bytes <= 1.15 * short_bytes, (short_bytes, long_bytes)


def test_records_held_in_memory_stay_bounded_on_a_long_run() -> None:
    from asyncrl._util.bounded import KEEP, append_bounded
    from asyncrl.controller.drops import KEEP_DROPPED
    from tests.controller.conftest import make_controller
    from tests.fakes import FakeEngine, FakeTrainer

    # Every 7th prompt fails for good: dropped-prompt records accumulate too.
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 1},
                          engines=[FakeEngine(0.5, fail=lambda r: r.prompt.prompt_id % 7 == 3)],
                          trainer=FakeTrainer(step_time=0.1), steps=2 * KEEP + 300, per_step=1,
                          capacity=4, min_chunk=1, inflight=4,
                          rollout_failure={**FORGIVING, "max_infra_attempts_per_prompt": 1})
    result = run_virtual(ctl.run(), loop="jump")
    assert result.steps == 2 * KEEP + 300
    assert len(ctl.step_records) == KEEP and ctl.step_records[-1]["step"] == 2 * KEEP + 299
    assert len(ctl.ctx.drops.recent) == KEEP_DROPPED < result.summary["ledger"]["failed"]
    assert len(ctl.ledger.live_records()) <= 8
    kept: list[int] = []
    for i in range(10 * KEEP):
        append_bounded(kept, i)
    assert KEEP <= len(kept) < 2 * KEEP and kept[-1] == 10 * KEEP - 1
