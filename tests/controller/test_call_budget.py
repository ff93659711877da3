"""The controller's per-group work, counted in Python calls (issue 33).

Wall-clock benchmarks (benchmarks/bench_controller_overhead.py) cannot gate a
test on a shared machine; the number of calls into asyncrl's own functions per
group is the same on any machine, under any load. The run mirrors the
benchmark: zero-latency fake engine and trainer, 64 groups per step, chunks of
one group, a window wide enough that nothing is evicted, under virtual time.
A change that adds a call per group on the hot path shows here at once.
"""

from __future__ import annotations

import cProfile
import gc
import pstats
from pathlib import Path

import asyncrl
from asyncrl._util.collector import RUN_YOUNG_THRESHOLD
from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller import Controller
from asyncrl.metrics import Timeline
from asyncrl.sim.clock import run_virtual
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

#: Calls into asyncrl per dispatched group, per-step work included: main at
#: 71d26a6 made 64.7 in this run, the trimmed hot path (issue 33) 53.2.
BUDGET = 58


def _controller(steps: int, per_step: int, capacity: int,
                trainer: FakeTrainer | None = None) -> Controller:
    task = FakeTask()
    return Controller(
        task=task, engines=[FakeEngine(0.0)], trainer=trainer or FakeTrainer(step_time=0.0),
        grpo=GRPOConfig(num_prompts_per_step=per_step, num_generations_per_prompt=1,
                        max_num_steps=steps),
        async_rl=AsyncRLConfig(
            sampler={"name": "windowed", "max_staleness_versions": 10**9},
            max_buffered_rollouts=capacity, min_groups_for_streaming_train=1,
            max_inflight_prompts=capacity),
        scorer=InlineScorer(task))


def _asyncrl_calls(profile: cProfile.Profile) -> int:
    package = str(Path(asyncrl.__file__).resolve().parent)
    stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
    return sum(nc for (filename, _, _), (_, nc, *_rest) in stats.items()
               if str(Path(filename).resolve()).startswith(package))


def test_calls_per_group_stay_within_budget() -> None:
    ctl = _controller(steps=60, per_step=64, capacity=1000)
    profile = cProfile.Profile()
    profile.enable()
    try:
        result = run_virtual(ctl.run())
    finally:
        profile.disable()
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and ledger["trained"] == 60 * 64, ledger
    per_group = _asyncrl_calls(profile) / ledger["dispatched"]
    assert per_group <= BUDGET, (
        f"{per_group:.1f} calls into asyncrl per group (budget {BUDGET}): something now "
        "runs once per group that did not; profile benchmarks/bench_controller_overhead.py")


class _FreezeProbe(FakeTrainer):
    """Reads, at every optimizer step, how many objects the collector skips and
    its thresholds."""

    def __init__(self) -> None:
        super().__init__(step_time=0.0, keep_chunks=False)
        self.frozen: list[int] = []
        self.thresholds: list[tuple[int, int, int]] = []

    async def finish_step(self, *, step: int) -> dict[str, float]:
        self.frozen.append(gc.get_freeze_count())
        self.thresholds.append(gc.get_threshold())
        return await super().finish_step(step=step)


def test_the_heap_alive_before_a_run_is_out_of_the_collectors_passes_during_it() -> None:
    # A full pass traverses every tracked object: in a real run the libraries
    # (torch alone: ~150k objects) and the model. asyncrl._util.collector.
    probe = _FreezeProbe()
    ctl = _controller(steps=3, per_step=4, capacity=16, trainer=probe)
    before = gc.get_freeze_count()
    run_virtual(ctl.run())
    assert len(probe.frozen) == 3 and min(probe.frozen) > before
    assert gc.get_freeze_count() == before  # given back when the run ends


def test_the_young_generation_is_collected_less_often_during_a_run_only() -> None:
    # The controller's per-group objects mostly die before a pass at 10,000
    # allocations sees them; at Python's 700 the passes traverse and promote
    # them (6% of the loop's instructions). asyncrl._util.collector.
    probe = _FreezeProbe()
    ctl = _controller(steps=3, per_step=4, capacity=16, trainer=probe)
    before = gc.get_threshold()
    gc.set_threshold(700, before[1], before[2])
    try:
        run_virtual(ctl.run())
        assert probe.thresholds == [(RUN_YOUNG_THRESHOLD, *before[1:])] * 3
        assert gc.get_threshold() == (700, *before[1:])  # given back when the run ends
    finally:
        gc.set_threshold(*before)


def test_the_timeline_holds_no_object_the_collector_tracks() -> None:
    # A long run keeps up to 500,000 intervals: tracked, each would lengthen
    # every full pass of the collector over the heap.
    timeline = Timeline()
    gc.collect()
    before = len(gc.get_objects())
    for i in range(2000):
        timeline.add("gen", 0, float(i), i + 0.5, "ok")
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    last = timeline.intervals[-1]
    assert (last.kind, last.lane, last.start, last.end, last.label) == ("gen", 0, 1999.0,
                                                                        1999.5, "ok")
    assert len(timeline.intervals) == 2000 and next(reversed(timeline.intervals)) == last
    assert [i.start for i in timeline.intervals[:2]] == [0.0, 1.0]
    assert timeline.to_list()[0] == {"kind": "gen", "lane": 0, "start": 0.0, "end": 0.5,
                                     "label": "ok"}
