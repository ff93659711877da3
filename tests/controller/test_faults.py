"""Retries, replacement of failed groups, errors surfacing, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.errors import TooManyFailedGroups, TrainerError
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, lognormal_latency
from tests.vtime import advance

IN_ORDER = {"name": "in_order", "max_lookahead_versions": 1}


def test_transient_failures_are_retried_and_succeed() -> None:
    engine = FakeEngine(1.0, fail=lambda r: r.attempt == 1 and r.prompt.prompt_id % 3 == 0)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=10,
                          rollout_failure={"max_infra_attempts_per_prompt": 3,
                                           "backoff_base_s": 0.5})
    result = run_virtual(ctl.run())
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and ledger["failed"] == 0 and ledger["trained"] == 40
    retried = [r for r in ctl.ledger.records() if r.prompt_id % 3 == 0 and r.state == "trained"]
    assert retried and all(r.attempts == 2 for r in retried)
    failed_marks = [i for i in ctl.timeline.intervals if i.label == "failed"]
    # One failed attempt per retried group; a group still in backoff at the end is pending.
    assert len(retried) <= len(failed_marks) <= len(retried) + ledger["pending"]


def test_backoff_is_exponential_in_virtual_time() -> None:
    engine = FakeEngine(0.0, fail=lambda r: r.prompt.prompt_id == 0 and r.attempt < 4)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 0}, engines=[engine],
                          trainer=FakeTrainer(step_time=0.0), steps=1,
                          rollout_failure={"max_infra_attempts_per_prompt": 5,
                                           "backoff_base_s": 1.0, "max_backoff_s": 3.0})
    result = run_virtual(ctl.run())
    # attempts 1..3 fail; waits 1 + 2 + 3 (capped) before attempt 4 succeeds
    assert result.summary["wall_time_s"] == pytest.approx(6.0)


def test_exhausted_attempts_are_failed_and_replaced_with_the_same_stamp() -> None:
    # Batches 0 and 1 hold prompts 0-7; the first replacement diverts prompts 8-11
    # into the spare pool, so batch 2 (step 2) holds prompts 12-15.
    bad = {2, 13}
    engine = FakeEngine(1.0, fail=lambda r: r.prompt.prompt_id in bad)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=8,
                          rollout_failure={"max_infra_attempts_per_prompt": 2,
                                           "backoff_base_s": 0.1,
                                           "max_consecutive_dropped_prompts": 1,
                                           "on_dropped_prompt": "replace"})
    result = run_virtual(ctl.run())
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and ledger["failed"] == 2 and ledger["trained"] == 32
    assert ledger["failed_infra"] == 2 and ledger["failed_data"] == 0
    failed = {r.prompt_id: r for r in ctl.ledger.records() if r.state == "failed"}
    assert set(failed) == bad and all(r.attempts == 2 for r in failed.values())
    # Step 0 and step 2 still trained 4 groups each, the replacements (spares 8
    # and 9) carrying the failed group's stamp.
    assert {r.prompt_id for r in ctl.ledger.records() if r.end_step in (0, 2)} == {
        0, 1, 3, 8, 9, 12, 14, 15}
    for step in (0, 2):
        trained = [r for r in ctl.ledger.records() if r.state == "trained" and r.end_step == step]
        assert len(trained) == 4 and {r.target_step for r in trained} == {step}
    assert sum(m["groups_failed"] for m in ctl.step_records) == 2
    assert sum(m["groups_failed_infra"] for m in ctl.step_records) == 2
    assert sum(m["prompts_replaced"] for m in ctl.step_records) == 2
    dropped = result.summary["failures"]["dropped_prompts"]
    assert {d["prompt_id"] for d in dropped} == bad
    assert all(d["kind"] == "infra" and d["outcome"] == "replaced" for d in dropped)


def test_too_many_failures_stop_the_run_with_a_clear_error() -> None:
    engine = FakeEngine(1.0, fail=lambda r: True)
    ctl = make_controller(IN_ORDER, engines=[engine], steps=5,
                          rollout_failure={"max_infra_attempts_per_prompt": 2,
                                           "backoff_base_s": 0.1,
                                           "max_consecutive_dropped_prompts": 3,
                                           "on_dropped_prompt": "replace",
                                           "max_replacement_attempts": 100})
    with pytest.raises(TooManyFailedGroups, match="max_consecutive_dropped_prompts=3") as err:
        run_virtual(ctl.run())
    assert "injected failure" in str(err.value.__cause__)
    # Stopped at a safe point: the state can be checkpointed, and it balances.
    assert ctl.stopped_at_safe_point and ctl.summary()["ledger"]["balanced"]
    # The three drops the budget allows failed for good; the group that used it up
    # (and any that failed alike before the run stopped) stays pending for a resume.
    # The budget error is raised once.
    counts = ctl.ledger.counts()
    assert counts["failed"] == 3 and counts["pending"] >= 1, counts
    assert not getattr(err.value, "__notes__", None)


def test_trainer_exception_cancels_the_rollout_pump_and_surfaces() -> None:
    engine = FakeEngine(lognormal_latency(0))
    ctl = make_controller(IN_ORDER, engines=[engine], trainer=FakeTrainer(fail_at_step=3),
                          steps=10)

    async def main() -> set[asyncio.Task]:
        with pytest.raises(TrainerError) as caught:
            await ctl.run()
        # One line naming the trainer, the call, the step and its groups; the
        # trainer's own error is the cause (asyncrl -v prints its traceback).
        text = str(caught.value)
        assert text.startswith("the trainer tests.fakes.FakeTrainer raised ValueError: "
                               "injected trainer failure at step 3 in train_chunk of step 3 "
                               "(groups ")
        assert "not checkpointed" in text and "\n" not in text
        assert isinstance(caught.value.__cause__, ValueError)
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    assert run_virtual(main()) == set()
    assert ctl.stop_reason == "error" and not ctl.stopped_at_safe_point
    # The summary says why the run stopped.
    assert ctl.summary()["stop_message"].startswith("TrainerError: the trainer ")
    assert ctl.ledger.counts()["trained"] == 12


def test_cancellation_leaves_nothing_running_and_records_pending() -> None:
    engine = FakeEngine(lognormal_latency(1, median=2.0))
    ctl = make_controller({"name": "ready_first", "max_staleness_versions": 2}, engines=[engine],
                          steps=1000, capacity=14)

    async def main() -> set[asyncio.Task]:
        run = asyncio.ensure_future(ctl.run())
        await advance(25.0)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}

    assert run_virtual(main()) == set()
    summary = ctl.summary()
    ledger = summary["ledger"]
    assert summary["stop_reason"] == "cancelled"
    assert ledger["balanced"] and ledger["pending"] > 0 and 0 < ledger["trained"] < 4000
    # The engine was told to drop the groups that were still generating.
    reserved = {s.group_id for s in ctl.buffer.slots() if not s.ready}
    assert reserved and reserved <= set(engine.aborted)


def test_source_exhausted_at_a_step_boundary_ends_cleanly() -> None:
    ctl = make_controller(IN_ORDER, task=FakeTask(num_prompts=20), steps=100)
    result = run_virtual(ctl.run())
    assert result.stop_reason == "source_exhausted" and result.steps == 5
    assert result.summary["ledger"] == {**result.summary["ledger"], "dispatched": 20,
                                        "trained": 20, "pending": 0, "balanced": True}


def test_source_exhausted_mid_step_ends_with_a_message_not_a_hang() -> None:
    ctl = make_controller({"name": "ready_first", "max_staleness_versions": 1},
                          task=FakeTask(num_prompts=18), steps=100)
    result = run_virtual(ctl.run())
    assert result.stop_reason == "incomplete_step"
    assert "ran dry in the middle of step 4" in ctl.stop_message
    assert result.summary["ledger"]["balanced"]
    assert result.summary["ledger"]["trained"] == 18
