"""The run's state a plan starts from (issue 38, :mod:`asyncrl.controller.snapshot`):
taken at step boundaries of a run in virtual time, every field checked against
what the fake engine and scorer saw happen (when each attempt started and
ended, with which start weight, how many tokens it made), and the model-based
autopilot sends it with every plan request."""

from __future__ import annotations

import asyncio
import dataclasses
import pickle

import pytest

from asyncrl.controller.snapshot import LiveGroup, RunState, run_state
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import FORGIVING, make_controller
from tests.controller.test_autoplan import PILOT, ScriptedPlanner
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer

N_GEN = 2
SCORE_S = 1.4
#: Latency of prompt p's attempts (quarter seconds: no attempt ends at a boundary).
LATENCY = (1.25, 2.75, 6.75, 0.5, 11.25)


def _tokens(prompt_id: int) -> int:
    return 1 + prompt_id % 3


@dataclasses.dataclass
class _Attempt:
    start: float
    end: float
    start_weight: int
    failed: bool


class LoggingEngine(FakeEngine):
    """FakeEngine that logs every attempt: when it started and ends, its start
    weight, whether it fails (the first attempt of every fourth prompt from 1)."""

    def __init__(self) -> None:
        super().__init__(lambda r: LATENCY[r.prompt.prompt_id % len(LATENCY)],
                         fail=lambda r: r.prompt.prompt_id % 4 == 1 and r.attempt == 1,
                         lengths=lambda r: [_tokens(r.prompt.prompt_id)] * r.num_generations)
        self.log: dict[int, list[_Attempt]] = {}

    async def generate(self, request):
        now = asyncio.get_running_loop().time()
        latency = self.latency(request)
        self.log.setdefault(request.group_id, []).append(
            _Attempt(now, now + latency, request.start_weight, self.fail(request)))
        return await super().generate(request)


def _expected(attempts: list[_Attempt], now: float, ready: bool) -> tuple:
    """(phase, age_s, attempts) of a group from the engine's log alone (its
    attempts started by ``now``)."""
    attempts = [a for a in attempts if a.start <= now]
    last = attempts[-1]
    if ready:
        return "ready", None, len(attempts)
    if last.end > now:
        return "generating", (now - last.start) if len(attempts) == 1 else None, len(attempts)
    if last.failed:
        return "backoff", None, len(attempts)
    assert last.end + SCORE_S > now  # generated: its rewards are being computed
    return "scoring", None, len(attempts)


def _run_with_snapshots(steps: int = 10):
    engine, trainer, task = LoggingEngine(), FakeTrainer(step_time=1.0), FakeTask()
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2}, engines=[engine],
                          trainer=trainer, task=task, steps=steps, per_step=4, capacity=14,
                          min_chunk=2, inflight=6, scorer=InlineScorer(task, delay=SCORE_S),
                          rollout_failure={**FORGIVING, "backoff_base_s": 2.5})
    taken: list[tuple[float, RunState, dict, int, list, int]] = []

    async def hook(controller, version: int) -> None:
        now = asyncio.get_running_loop().time()
        ready = {s.group_id for s in controller.buffer.slots() if s.ready}
        live = sorted(s.group_id for s in controller.buffer.slots())
        taken.append((now, run_state(controller.ctx, controller.dispatcher),
                      controller.sampler.state_dict(), len(trainer.steps),
                      [(gid, gid in ready) for gid in live],
                      len(controller.dispatcher.undispatched()["queued"])))

    ctl.on_step_end = hook
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"]
    return engine, taken


def test_the_state_is_what_the_engine_and_scorer_saw() -> None:
    engine, taken = _run_with_snapshots()
    phases = set()
    for now, state, sampler, trained_steps, live, queued in taken:
        assert state.version == trained_steps and state.sampler == sampler
        assert len(state.groups) == len(live) and len(state.queued) == queued
        for group, (gid, ready) in zip(state.groups, live):  # dispatch order: ids grow
            attempts = engine.log[gid]
            phase, age, count = _expected(attempts, now, ready)
            assert (group.phase, group.attempts) == (phase, count), (now, gid)
            assert group.start_weight == attempts[-1].start_weight
            if age is None:
                assert group.age_s is None
            else:
                assert abs(group.age_s - age) < 1e-9
            assert (group.end_weight is None) == (not ready)
            assert group.tokens == (N_GEN * _tokens(gid) if ready else 0)  # prompt id = group id
            phases.add(phase)
    # The run went through every case: the test checked each of them.
    assert phases == {"ready", "generating", "scoring", "backoff"}
    assert any(s.queued for _, s, *_ in taken)
    assert any(g.age_s is not None and g.age_s > 2 for _, s, *_ in taken for g in s.groups)


def test_the_state_is_small_plain_data() -> None:
    _, taken = _run_with_snapshots()
    state = max((s for _, s, *_ in taken), key=lambda s: len(s.groups))
    assert pickle.loads(pickle.dumps(state)) == state
    assert all(type(g) is LiveGroup for g in state.groups)
    assert state.inflight == sum(g.phase != "ready" for g in state.groups) > 0


def test_a_plan_request_carries_the_state_of_its_step_boundary() -> None:
    planner = ScriptedPlanner([None] * 20)
    engine = FakeEngine(lambda r: 1.0 + 2.5 * (r.group_id % 3))
    seen: list[RunState] = []

    async def hook(controller, version: int) -> None:
        seen.append(run_state(controller.ctx, controller.dispatcher))

    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2}, engines=[engine],
                          trainer=FakeTrainer(step_time=1.0), steps=8, per_step=4, capacity=32,
                          min_chunk=4, inflight=8, planner=planner, autopilot=PILOT)
    ctl.on_step_end = hook  # runs before the autopilot at each boundary: the same instant
    run_virtual(ctl.run())
    assert planner.requests
    for request in planner.requests:
        assert request.state == seen[request.step - 1] and request.state.version == request.step
        # The boundary on the step records' clock: the latency fit places the
        # in-flight groups' dispatch times on it (clock_s - age_s).
        assert request.state.clock_s == pytest.approx(request.records[-1]["wall_time_s"])
    assert any(r.state.inflight for r in planner.requests)
