"""Deterministic mode at the controller level: the same result under any timing."""

from __future__ import annotations

import pytest

from asyncrl.errors import ConfigError
from asyncrl.sim.clock import run_virtual
from asyncrl.types import GroupResult
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, lognormal_latency

#: Fields that measure time or momentary occupancy, not what was trained.
TIMING = {"wall_time_s", "step_time_s", "trainer_idle_s", "generator_util", "groups_per_s",
          "buffer_ready", "inflight"}


class PinnedEngine(FakeEngine):
    """Output depends only on the request's seed and pinned weight version."""

    def __init__(self, latency) -> None:
        super().__init__(latency)
        self.pins: dict = {}

    async def generate(self, request):
        result: GroupResult = await super().generate(request)
        assert request.seed is not None and request.weight_version is not None
        assert request.weight_version <= self.weight_version  # never newer than held
        self.pins[request.group_id] = request.weight_version
        n = request.num_generations
        result.completion_texts = [str((request.seed + request.weight_version + i) % 7)
                                   for i in range(n)]
        result.start_weight = result.end_weight = request.weight_version
        return result


SAMPLERS = [
    {"name": "in_order", "max_lookahead_versions": 2},
    {"name": "weight_fifo", "max_staleness_versions": 1},
    {"name": "ready_first", "max_staleness_versions": 2},
]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_same_config_same_result_under_different_timing(sampler: dict) -> None:
    runs = []
    for timing_seed in (1, 2):
        engine = PinnedEngine(lognormal_latency(timing_seed, sigma=1.2))
        ctl = make_controller(sampler, engines=[engine],
                              trainer=FakeTrainer(step_time=0.3 * timing_seed),
                              steps=15, capacity=12, min_chunk=1)
        ctl.deterministic = True
        run_virtual(ctl.run())
        window = ctl.sampler.window
        for rec in ctl.ledger.records():
            batch = rec.prompt_id // 4
            assert engine.pins.get(rec.group_id, rec.start_weight) == max(0, batch - window)
        trained: dict[int, list] = {}
        for step, rollouts in ctl.trainer.chunks:
            trained.setdefault(step, []).extend(r.group_id for r in rollouts)
        metrics = [{k: v for k, v in r.items() if k not in TIMING} for r in ctl.step_records]
        runs.append((trained, metrics))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]


def test_deterministic_refuses_an_ungated_sampler() -> None:
    from asyncrl.controller import Controller
    from tests.fakes import FakeTask

    base = make_controller({"name": "windowed", "max_staleness_versions": 1})
    with pytest.raises(ConfigError, match="deterministic: true needs a sampler that pins"):
        Controller(task=FakeTask(), engines=[FakeEngine()], trainer=FakeTrainer(),
                   grpo=base.grpo, async_rl=base.cfg, deterministic=True)
