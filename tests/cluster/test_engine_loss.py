"""How the controller treats engines that lose workers, with fakes under virtual time.

These pin the controller's side of the Ray backend's contract: an engine that
reports ``healthy = False`` gets no new groups while another is healthy, an
:class:`EngineUnavailable` attempt is retried at once and not charged to the
group's budgets, and :class:`BackendLost` fails the run.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from asyncrl.errors import BackendLost, EngineUnavailable, RolloutWorkersLost
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer

IN_ORDER = {"name": "in_order", "max_lookahead_versions": 1}


class LosingEngine(FakeEngine):
    """Loses the first attempt of the groups ``lose(request)`` picks, as a dead
    worker would, and can be marked unhealthy."""

    def __init__(self, *args, lose=lambda _r: False, error=EngineUnavailable, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.lose = lose
        self.error = error
        self.healthy = True
        self.requests: list[tuple[object, int]] = []

    async def generate(self, request):
        self.requests.append((request.group_id, request.attempt))
        if self.lose(request):
            raise self.error(f"worker died while generating group {request.group_id}")
        return await super().generate(request)


def test_lost_attempts_retry_at_once_without_charging_the_failure_budget() -> None:
    # Every group loses its first attempt; with max_infra_attempts_per_prompt=1
    # any charged failure would fail the group for good.
    engines = [LosingEngine(1.0, lose=lambda r: r.attempt == 1) for _ in range(2)]
    ctl = make_controller(IN_ORDER, engines=engines, steps=4,
                          trainer=FakeTrainer(step_time=0.0),
                          rollout_failure={"max_infra_attempts_per_prompt": 1,
                                           "backoff_base_s": 100.0, "max_backoff_s": 100.0})
    result = run_virtual(ctl.run())
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and ledger["failed"] == 0 and ledger["trained"] == 16
    trained = [r for r in ctl.ledger.records() if r.state == "trained"]
    assert trained and all(r.attempts == 2 for r in trained)
    # No backoff: a lost attempt is no reason to wait (backoff_base_s=100 would show).
    assert result.summary["wall_time_s"] < 50
    lost = [i for i in ctl.timeline.intervals if i.label == "lost"]
    assert len(lost) >= len(trained)


def test_a_genuine_failure_after_a_lost_attempt_is_still_charged() -> None:
    # Attempt 1 lost with a worker, attempt 2 fails for real: the infra budget of
    # 1 is spent by the real failure only, so the group fails for good once.
    def fail(r):
        return r.prompt.prompt_id == 0 and r.attempt == 2

    engine = LosingEngine(1.0, lose=lambda r: r.prompt.prompt_id == 0 and r.attempt == 1,
                          fail=fail)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=2,
                          trainer=FakeTrainer(step_time=0.0),
                          rollout_failure={"max_infra_attempts_per_prompt": 1,
                                           "max_consecutive_dropped_prompts": 4,
                                           "on_dropped_prompt": "replace"})
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["failed"] == 1
    assert ctl.ledger[0].state == "failed" and ctl.ledger[0].attempts == 2


def test_unhealthy_engines_get_no_new_groups_while_another_is_healthy() -> None:
    sick, well = LosingEngine(1.0), LosingEngine(1.0)
    sick.healthy = False
    ctl = make_controller(IN_ORDER, engines=[sick, well], steps=3,
                          trainer=FakeTrainer(step_time=0.0))
    result = run_virtual(ctl.run())
    assert result.summary["ledger"]["balanced"]
    assert sick.requests == [] and well.requests


def test_when_no_engine_is_healthy_groups_still_go_out() -> None:
    # A restarting worker waits inside generate; the controller must not starve.
    engines = [LosingEngine(1.0), LosingEngine(1.0)]
    for engine in engines:
        engine.healthy = False
    ctl = make_controller(IN_ORDER, engines=engines, steps=2, trainer=FakeTrainer(step_time=0.0))
    result = run_virtual(ctl.run())
    assert result.summary["steps"] == 2


def test_backend_lost_fails_the_run_with_that_error() -> None:
    engine = LosingEngine(1.0, lose=lambda r: r.prompt.prompt_id == 5,
                          error=lambda msg: RolloutWorkersLost(f"every rollout worker died: {msg}"))
    ctl = make_controller(IN_ORDER, engines=[engine], steps=10,
                          trainer=FakeTrainer(step_time=0.0))
    with pytest.raises(BackendLost, match="every rollout worker died"):
        run_virtual(ctl.run())
    assert ctl.stop_reason == "error"


@pytest.mark.e2e
def test_importing_asyncrl_does_not_import_ray() -> None:
    code = (
        "import sys, asyncrl, asyncrl.cluster, asyncrl.run.train\n"
        "from asyncrl.cluster import build_ray_backends\n"
        "assert 'ray' not in sys.modules, 'ray was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
