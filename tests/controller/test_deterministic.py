"""Deterministic mode at the controller level: the same result under any timing."""

from __future__ import annotations

import pytest

from asyncrl.controller.stats import measures_timing
from asyncrl.errors import ConfigError
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Completion, GroupResult
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, lognormal_latency


class PinnedEngine(FakeEngine):
    """Output depends only on the request's seed and pinned weight version."""

    def __init__(self, latency) -> None:
        super().__init__(latency)
        self.pins: dict = {}
        self.retained = {0}

    async def retain_weight_versions(self, versions) -> None:
        self.retained = set(versions)

    async def update_weights(self, weights, version: int) -> None:
        await super().update_weights(weights, version)
        self.retained.add(version)

    async def generate(self, request):
        assert request.weight_version in self.retained  # the controller kept what it needs
        result: GroupResult = await super().generate(request)
        assert request.seed is not None and request.weight_version is not None
        assert request.weight_version <= self.weight_version  # never newer than held
        self.pins[request.group_id] = request.weight_version
        n = request.num_generations
        texts = [str((request.seed + request.weight_version + i) % 7) for i in range(n)]
        # A pinned group's tokens all come from its pinned version.
        completions = [Completion.of([3], [-0.5], request.weight_version, "stop", text)
                       for text in texts]
        return GroupResult(result.group_id, result.prompt_ids, completions,
                           request.weight_version)


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
                              steps=15, capacity=12, min_chunk=1, deterministic=True)
        run_virtual(ctl.run())
        window = ctl.sampler.window
        for rec in ctl.ledger.records():
            batch = rec.prompt_id // 4
            assert engine.pins.get(rec.group_id, rec.start_weight) == max(0, batch - window)
        trained: dict[int, list] = {}
        for step, rollouts in ctl.trainer.chunks:
            trained.setdefault(step, []).extend(r.group_id for r in rollouts)
        metrics = [{k: v for k, v in r.items() if not measures_timing(k)}
                   for r in ctl.step_records]
        runs.append((trained, metrics))
    assert runs[0][0] == runs[1][0]
    assert runs[0][1] == runs[1][1]


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_over_sampling_keeps_a_run_deterministic(sampler: dict) -> None:
    """grpo.dynamic_sampling.batch_multiplier (without a filter): batches of 6 for
    steps of 4, the surplus trained later or evicted, the same under any timing."""
    runs = []
    for timing_seed in (1, 2):
        engine = PinnedEngine(lognormal_latency(timing_seed, sigma=1.2))
        ctl = make_controller(sampler, engines=[engine],
                              trainer=FakeTrainer(step_time=0.3 * timing_seed),
                              steps=12, capacity=18, min_chunk=1, deterministic=True,
                              dynamic_sampling={"batch_multiplier": 1.5})
        run_virtual(ctl.run())
        for rec in ctl.ledger.records():  # each batch of 6 pinned like a batch of 4
            assert engine.pins.get(rec.group_id, rec.start_weight) == max(
                0, rec.prompt_id // 6 - ctl.sampler.window)
        trained: dict[int, list] = {}
        for step, rollouts in ctl.trainer.chunks:
            trained.setdefault(step, []).extend(r.group_id for r in rollouts)
        assert all(len(ids) == 4 for ids in trained.values())
        # What was trained, and the step metrics that do not measure timing.
        # When a surplus group that leaves weight_fifo's window goes, and whether
        # it is still generating then (aborted) or done (evicted), is timing's.
        metrics = [{k: v for k, v in r.items() if not measures_timing(k)
                    and k not in ("groups_evicted", "groups_aborted")}
                   for r in ctl.step_records]
        runs.append((trained, metrics))
    assert runs[0] == runs[1]


def test_deterministic_refuses_engines_that_cannot_keep_versions() -> None:
    with pytest.raises(ConfigError, match="retain_weight_versions"):
        make_controller({"name": "in_order", "max_lookahead_versions": 1}, deterministic=True)


def test_a_custom_sampler_reporting_pins_supports_deterministic_mode() -> None:
    from asyncrl.sampling import BaseSampler

    class EveryOther(BaseSampler):  # gated, window 1, pinned like the built-ins
        gated, window = True, 1

        async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
            eligible = self.buffer.ready_in_weight_range(None, current_train_weight,
                                                         limit=max_prompt_groups)
            return self._take(eligible, min_prompt_groups)

    globals()["EveryOther"] = EveryOther
    engine = PinnedEngine(lognormal_latency(3, sigma=1.0))
    ctl = make_controller({"name": "custom", "target": f"{__name__}:EveryOther"},
                          engines=[engine], steps=6, capacity=12, min_chunk=1, deterministic=True)
    run_virtual(ctl.run())
    assert ctl.steps_done == 6
    assert all(w == max(0, gid // 4 - 1) for gid, w in engine.pins.items() if gid < 24)


def test_deterministic_refuses_an_ungated_sampler() -> None:
    from asyncrl.controller import Controller
    from tests.fakes import FakeTask

    base = make_controller({"name": "windowed", "max_staleness_versions": 1})
    with pytest.raises(ConfigError, match="deterministic: true needs a sampler that pins"):
        Controller(task=FakeTask(), engines=[FakeEngine()], trainer=FakeTrainer(),
                   grpo=base.grpo, async_rl=base.cfg, deterministic=True)
