"""Evaluation on held-out prompts during a run (virtual time, fakes)."""

from __future__ import annotations

import pytest

from asyncrl.controller.evaluation import EvalSettings, Evaluator, pass_at_k
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Prompt
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTask, InlineScorer

HELD_OUT = [Prompt(1000 + i, f"held-out {i}", answer=(1000 + i) % 7) for i in range(5)]


def test_pass_at_k_by_hand() -> None:
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - (3 / 4) * (2 / 3))
    assert pass_at_k(3, 1, 3) == 1.0


class EvalAwareEngine(FakeEngine):
    """Eval groups take 10 s, rollouts 1 s; records what each eval request asked."""

    def __init__(self) -> None:
        super().__init__(lambda r: 10.0 if isinstance(r.group_id, tuple) else 1.0)
        self.eval_requests: list = []

    async def generate(self, request):
        if isinstance(request.group_id, tuple):
            self.eval_requests.append(request)
        return await super().generate(request)


def test_eval_every_n_steps_reports_reward_and_pass_at_k_without_touching_the_ledger() -> None:
    engine, task = EvalAwareEngine(), FakeTask()
    evaluator = Evaluator(HELD_OUT, InlineScorer(task),
                          EvalSettings(every_steps=2, num_generations=3, temperature=0.0))
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1}, engines=[engine],
                          task=task, steps=6, evaluator=evaluator)
    result = run_virtual(ctl.run())
    records = ctl.step_records
    evaluated = [r["trainer_version"] for r in records if "eval/reward_mean" in r]
    assert evaluated == [2, 4, 6]
    for r in records:
        if "eval/reward_mean" in r:
            # The fake's first completion of each group is right, the other two wrong.
            assert r["eval/reward_mean"] == pytest.approx(1 / 3)
            assert r["eval/pass@1"] == pytest.approx(1 / 3) and r["eval/pass@3"] == 1.0
            assert r["eval/num_prompts"] == len(HELD_OUT)
    assert len(engine.eval_requests) == 3 * len(HELD_OUT)
    assert all(q.temperature == 0.0 and q.num_generations == 3 for q in engine.eval_requests)
    # Eval groups never reach the buffer or the ledger.
    assert result.summary["ledger"]["balanced"]
    assert all(isinstance(rec.group_id, int) for rec in ctl.ledger.records())


def test_the_rollout_side_keeps_going_while_the_train_pump_evaluates() -> None:
    engine, task = EvalAwareEngine(), FakeTask()
    evaluator = Evaluator(HELD_OUT, InlineScorer(task), EvalSettings(every_steps=3))
    ctl = make_controller({"name": "ready_first", "max_staleness_versions": 2}, engines=[engine],
                          task=task, steps=3, capacity=12, evaluator=evaluator)
    run_virtual(ctl.run())
    sync_end = max(i.end for i in ctl.timeline.intervals if i.kind == "sync")
    # Rollout generations ran inside the 10 s evaluation after the last sync.
    inside = [i for i in ctl.timeline.intervals
              if i.kind == "gen" and sync_end < i.end < sync_end + 10.0]
    assert inside, "no rollout finished while the eval ran"
