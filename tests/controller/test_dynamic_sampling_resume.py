"""A run stopped by ``grpo.dynamic_sampling.max_gen_batches`` resumes once the cause
is fixed, whichever fix the error suggests: the filtered groups whose replacement
went past the budget are replaced after the resume (as an uninterrupted run with
the new setting would), so no step waits for a group that will never come, none
trains short and nothing is lost. Resumed unchanged, the run stops again at the
same budget. Virtual time throughout."""

from __future__ import annotations

import collections
import json

import pytest

from asyncrl.errors import DynamicSamplingBudgetExceeded
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.controller.test_drops import SAMPLERS  # every built-in, the same windows
from tests.fakes import FakeEngine, FakeTrainer, FlatTask, lognormal_latency

N = 4
STEPS = 8
#: 6 groups a batch, none replaced: a batch with a third group filtered stops the run.
STOPPING = {"filter": "zero_variance", "batch_multiplier": 1.5, "max_gen_batches": 1}
FIXES = {
    "max_gen_batches": {"max_gen_batches": 20},
    "filter_none": {"filter": "none"},
    "batch_multiplier": {"batch_multiplier": 4.0},
}
TASK = FlatTask(0.5)


def controller(sampler: dict, dynamic: dict, seed: int, **kw):
    # Room for two steps of the largest batches (16 groups with batch_multiplier 4).
    return make_controller(sampler, task=TASK, steps=STEPS, per_step=N, capacity=48,
                           inflight=8, dynamic_sampling=dynamic,
                           engines=kw.pop("engines", None)
                           or [FakeEngine(lognormal_latency(seed, sigma=0.7))], **kw)


def stop(sampler: dict) -> tuple:
    first = controller(sampler, STOPPING, 3)
    with pytest.raises(DynamicSamplingBudgetExceeded, match="max_gen_batches=1 is used up"):
        run_virtual(first.run())
    assert first.stopped_at_safe_point and first.steps_done < STEPS
    return first, json.loads(json.dumps(first.state_dict()))


def resume(first, state: dict, sampler: dict, dynamic: dict):
    trainer = FakeTrainer()
    trainer.load_state_dict(first.trainer.state_dict())
    engine = FakeEngine(lognormal_latency(4, sigma=0.7))
    engine.weight_version = state["trainer_version"]
    second = controller(sampler, dynamic, 4, engines=[engine], trainer=trainer,
                        history=first.ledger.history)
    second.load_state_dict(state)
    return second


def owed(state: dict) -> list[int]:
    return [d["prompt"]["prompt_id"] for d in state["dispatch"]["queued"] if d.get("owed")]


@pytest.mark.parametrize("fix", FIXES, ids=str)
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_a_run_stopped_by_the_filter_budget_resumes_with_each_fix(sampler, fix) -> None:
    first, state = stop(sampler)
    # The filtered groups that needed a replacement past the budget: their
    # replacements wait, queued, in the checkpoint.
    waiting = owed(state)
    assert waiting
    assert state["dispatch"]["dynamic_sampling"]["batches"]

    second = resume(first, state, sampler, {**STOPPING, **FIXES[fix]})
    result = run_virtual(second.run())
    assert result.steps == STEPS
    ledger = result.summary["ledger"]
    assert ledger["balanced"], ledger
    sizes = [r["groups_trained"] for r in first.step_records + second.step_records]
    assert sizes == [N] * STEPS, sizes
    records = second.ledger.records()
    # Every group ends in exactly one state; the replacements that waited were generated.
    assert len({r.group_id for r in records}) == len(records)
    assert set(waiting) <= {r.prompt_id for r in records}
    if fix != "filter_none":  # the filter still on: every trained group has signal
        assert all(not TASK.flat(r.prompt_id) for r in records if r.state == "trained")
        ds = result.summary["dynamic_sampling"]
        assert ds["filtered"] == ledger["filtered"]
    if sampler["name"] == "in_order":  # a replacement keeps its step
        assert all(r.target_step == r.end_step for r in records if r.state == "trained")
    ids = collections.Counter(r.prompt_id for r in records)
    untrained = result.summary["prompts"]["untrained"]
    ids.update(p for key in ("queued", "spare", "lookahead") for p in untrained[key])
    assert set(ids.values()) == {1}, "a prompt was dispatched twice"


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_resumed_unchanged_it_stops_again_then_a_fix_completes_it(sampler) -> None:
    first, state = stop(sampler)
    again = resume(first, state, sampler, STOPPING)
    with pytest.raises(DynamicSamplingBudgetExceeded, match="max_gen_batches=1 is used up"):
        run_virtual(again.run())
    assert again.stopped_at_safe_point
    assert again.summary()["ledger"]["balanced"]
    state2 = json.loads(json.dumps(again.state_dict()))
    assert owed(state2)  # still waiting: the budget did not allow them
    # No batch generated more than its budget allows (one batch of 6, none replaced).
    assert again.summary()["dynamic_sampling"]["replaced"] == 0
    third = resume(again, state2, sampler, {**STOPPING, "max_gen_batches": 20})
    result = run_virtual(third.run())
    assert result.steps == STEPS and result.summary["ledger"]["balanced"]
    sizes = [r["groups_trained"]
             for r in first.step_records + again.step_records + third.step_records]
    assert sizes == [N] * STEPS, sizes
