"""``grpo.dynamic_sampling`` in the controller (issue 32): groups without signal
are filtered at commit, replaced within their own budget, and every trained step
still has ``num_prompts_per_step`` informative groups. Virtual time throughout."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from asyncrl.errors import BackendBug, DynamicSamplingBudgetExceeded, SetupError
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Rollout
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, FlatTask, lognormal_latency
from tests.vtime import advance

ZERO_VAR = {"filter": "zero_variance", "batch_multiplier": 1.5, "max_gen_batches": 20}


def informative(rollout: Rollout) -> bool:
    return max(rollout.rewards) - min(rollout.rewards) > 1e-6


def per_step(trainer: FakeTrainer) -> dict[int, list[Rollout]]:
    steps: dict[int, list[Rollout]] = collections.defaultdict(list)
    for step, rollouts in trainer.chunks:
        steps[step].extend(rollouts)
    return steps


def balance(summary: dict) -> None:
    ledger = summary["ledger"]
    assert ledger["balanced"], ledger
    ends = sum(ledger[k] for k in ("trained", "evicted", "aborted", "failed", "filtered",
                                   "pending"))
    assert ends == ledger["dispatched"], ledger


@pytest.mark.parametrize("multiplier", [1.0, 1.5])
def test_every_step_trains_a_full_batch_of_informative_groups(multiplier: float) -> None:
    trainer = FakeTrainer()
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          engines=[FakeEngine(lognormal_latency(3))], trainer=trainer,
                          task=FlatTask(0.8), steps=12, per_step=4, capacity=12, inflight=8,
                          dynamic_sampling={**ZERO_VAR, "batch_multiplier": multiplier})
    result = run_virtual(ctl.run())
    assert result.steps == 12
    steps = per_step(trainer)
    assert sorted(steps) == list(range(12))
    for step, rollouts in steps.items():
        assert len(rollouts) == 4, step
        assert all(informative(r) for r in rollouts), step
    balance(result.summary)
    ledger = result.summary["ledger"]
    assert ledger["filtered"] > ledger["trained"]  # most groups carried no signal
    ds = result.summary["dynamic_sampling"]
    assert ds["filtered"] == ledger["filtered"]
    assert ds["groups_per_batch"] == (6 if multiplier == 1.5 else 4)
    assert set(ds["filtered_by_reason"]) <= {"zero_variance: every reward 0",
                                             "zero_variance: every reward 1"}
    # Every filtered group is in the ledger with its reason, and held no ready slot.
    filtered = [r for r in ctl.ledger.records() if r.state == "filtered"]
    assert len(filtered) == ledger["filtered"]
    assert all(r.filter_reason.startswith("zero_variance") for r in filtered)
    # A replacement keeps the target_step of the group it replaces (in_order).
    trained = [r for r in ctl.ledger.records() if r.state == "trained"]
    assert all(r.target_step == r.end_step for r in trained)


def test_step_records_report_the_filter() -> None:
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2},
                          task=FlatTask(0.5), steps=6, per_step=4, capacity=12,
                          dynamic_sampling=ZERO_VAR)
    run_virtual(ctl.run())
    for record in ctl.step_records:
        assert 0.0 <= record["train/filtered_frac"] <= 1.0
        assert record["train/generated_per_trained"] > 0
        assert 0.0 < record["train/filter_budget_used"] <= 1.0
    assert any(r["train/filtered_frac"] > 0 for r in ctl.step_records)


def test_the_filter_off_adds_nothing() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          task=FlatTask(0.8), steps=3)
    result = run_virtual(ctl.run())
    assert ctl.ctx.dynamic is None
    assert result.summary["ledger"]["filtered"] == 0
    assert "train/filtered_frac" not in ctl.step_records[0]


def test_a_run_past_the_budget_stops_naming_it() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          task=FlatTask(1.0), steps=10, per_step=4,
                          dynamic_sampling={"filter": "zero_variance", "max_gen_batches": 3})
    with pytest.raises(DynamicSamplingBudgetExceeded) as err:
        run_virtual(ctl.run())
    message = str(err.value)
    assert "grpo.dynamic_sampling.max_gen_batches=3" in message
    assert "Raise grpo.dynamic_sampling.max_gen_batches" in message
    # The batch that used the budget up generated max_gen_batches batches' worth.
    assert "generated 12 groups (3 batch(es) of 4)" in message
    assert ctl.stopped_at_safe_point and ctl.steps_done == 0
    balance(ctl.summary())
    # No batch replaced more than 2 batches' worth (the two admitted ones: lookahead 1).
    replaced = ctl.summary()["dynamic_sampling"]["replaced"]
    assert 8 <= replaced <= 16, replaced


@pytest.mark.parametrize("sampler", [{"name": "in_order", "max_lookahead_versions": 1},
                                     {"name": "windowed", "max_staleness_versions": 1}],
                         ids=lambda s: s["name"])
def test_stop_and_resume_with_the_filter_on_loses_nothing(sampler: dict) -> None:
    steps, ckpt_step = 12, 5
    kw = {"steps": steps, "capacity": 12, "inflight": 6, "task": FlatTask(0.7),
          "dynamic_sampling": ZERO_VAR}
    saved: dict = {}

    async def snapshot(ctl, version: int) -> None:
        if version == ckpt_step:
            saved["state"] = json.loads(json.dumps(ctl.state_dict()))
            saved["trainer"] = ctl.trainer.state_dict()

    first = make_controller(sampler, engines=[FakeEngine(lognormal_latency(5))], **kw)
    first.on_step_end = snapshot

    async def crash() -> None:
        run = asyncio.ensure_future(first.run())
        while first.steps_done < ckpt_step:
            await first.buffer.wait_changed()
        await advance(2.5)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    run_virtual(crash())
    trainer = FakeTrainer()
    trainer.load_state_dict(saved["trainer"])
    engine = FakeEngine(lognormal_latency(6))
    engine.weight_version = ckpt_step
    second = make_controller(sampler, engines=[engine], trainer=trainer,
                             history=first.ledger.history, **kw)
    second.load_state_dict(saved["state"])
    result = run_virtual(second.run())
    assert result.steps == steps
    balance(result.summary)
    records = second.ledger.records()
    ids = collections.Counter(r.prompt_id for r in records)
    # Prompts drawn for replacements and still waiting in the spare pool (or read
    # ahead) at the end are accounted for by the summary, not the ledger.
    untrained = result.summary["prompts"]["untrained"]
    ids.update(p for key in ("queued", "spare", "lookahead") for p in untrained[key])
    assert sorted(ids) == list(range(max(ids) + 1)), "a prompt was skipped"
    assert set(ids.values()) == {1}, "a prompt was dispatched twice"
    assert result.summary["ledger"]["trained"] == steps * 4
    assert all(not FlatTask(0.7).flat(r.prompt_id) for r in records if r.state == "trained")
    # The filter's counts went on from the checkpoint.
    assert result.summary["dynamic_sampling"]["filtered"] == result.summary["ledger"]["filtered"]


def test_a_graceful_stop_and_resume_with_the_filter_on_loses_nothing() -> None:
    """What SIGINT does in ``asyncrl train``: stop at the next safe point, take
    the state, resume from it."""
    steps = 10
    kw = {"steps": steps, "capacity": 12, "inflight": 6, "task": FlatTask(0.7),
          "dynamic_sampling": ZERO_VAR}

    async def stop_at_4(ctl, version: int) -> None:
        if version == 4:
            ctl.request_stop()

    first = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                            engines=[FakeEngine(lognormal_latency(8))], **kw)
    first.on_step_end = stop_at_4
    stopped = run_virtual(first.run())
    assert stopped.steps == 4 and first.stopped_at_safe_point
    balance(stopped.summary)
    assert stopped.summary["ledger"]["pending"] > 0  # groups in flight and buffered
    state = json.loads(json.dumps(first.state_dict()))
    trainer = FakeTrainer()
    trainer.load_state_dict(first.trainer.state_dict())
    engine = FakeEngine(lognormal_latency(9))
    engine.weight_version = 4
    second = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                             engines=[engine], trainer=trainer,
                             history=first.ledger.history, **kw)
    second.load_state_dict(state)
    result = run_virtual(second.run())
    assert result.steps == steps
    balance(result.summary)
    assert result.summary["ledger"]["trained"] == steps * 4
    records = second.ledger.records()
    ids = collections.Counter(r.prompt_id for r in records)
    untrained = result.summary["prompts"]["untrained"]
    ids.update(p for key in ("queued", "spare", "lookahead") for p in untrained[key])
    assert sorted(ids) == list(range(max(ids) + 1)) and set(ids.values()) == {1}
    # Filtered before the stop and after it: each group once, in one state.
    assert len({r.group_id for r in records}) == len(records)
    assert result.summary["dynamic_sampling"]["filtered"] == result.summary["ledger"]["filtered"]
    assert result.summary["ledger"]["filtered"] > stopped.summary["ledger"]["filtered"] > 0


class OddPrompts:
    """A custom filter: odd prompt ids carry no signal."""

    def reject(self, rollout: Rollout) -> str | None:
        return "odd prompt" if rollout.prompt.prompt_id % 2 else None


class NoReject:
    """Not a filter: it has no reject."""


class Broken:
    def reject(self, rollout: Rollout) -> str | None:
        raise ZeroDivisionError("oops")


def test_a_custom_filter_is_loaded_from_its_target() -> None:
    trainer = FakeTrainer()
    ctl = make_controller({"name": "ready_first", "max_staleness_versions": 1}, trainer=trainer,
                          steps=5, dynamic_sampling={
                              "filter": f"{__name__}:OddPrompts", "max_gen_batches": 4})
    result = run_virtual(ctl.run())
    assert result.steps == 5
    trained = [r for _, rs in trainer.chunks for r in rs]
    assert trained and all(r.prompt.prompt_id % 2 == 0 for r in trained)
    assert result.summary["dynamic_sampling"]["filtered_by_reason"]["odd prompt"] > 0
    balance(result.summary)


def test_a_filter_that_raises_stops_the_run_naming_it() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1}, steps=5,
                          dynamic_sampling={"filter": f"{__name__}:Broken"})
    with pytest.raises(BackendBug, match=r"grpo\.dynamic_sampling\.filter"):
        run_virtual(ctl.run())
    assert ctl.stopped_at_safe_point
    balance(ctl.summary())


@pytest.mark.parametrize("target, needle", [
    ("tests.controller.test_dynamic_sampling:Missing", "has no attribute 'Missing'"),
    ("tests.controller.test_dynamic_sampling:NoReject", "does not satisfy"),
])
def test_a_bad_custom_filter_is_one_line_naming_the_key(target: str, needle: str) -> None:
    from asyncrl.errors import ConfigError

    with pytest.raises(ConfigError, match=r"grpo\.dynamic_sampling\.filter") as err:
        make_controller({"name": "in_order"}, dynamic_sampling={"filter": target})
    assert needle in str(err.value)


def test_deterministic_mode_refuses_the_filter_with_the_fix() -> None:
    with pytest.raises(SetupError, match=r"grpo\.dynamic_sampling\.filter: none"):
        make_controller({"name": "in_order", "max_lookahead_versions": 1}, deterministic=True,
                        dynamic_sampling={"filter": "zero_variance"})


def test_zero_variance_with_one_completion_per_group_is_refused() -> None:
    from asyncrl.config import AsyncRLConfig, GRPOConfig
    from asyncrl.controller import Controller
    from tests.fakes import FakeTask, InlineScorer

    task = FakeTask()
    with pytest.raises(SetupError, match=r"num_generations_per_prompt >= 2"):
        Controller(task=task, engines=[FakeEngine()], trainer=FakeTrainer(),
                   grpo=GRPOConfig(num_generations_per_prompt=1,
                                   dynamic_sampling={"filter": "zero_variance"}),
                   async_rl=AsyncRLConfig(), scorer=InlineScorer(task))


def test_a_filter_without_room_is_warned_about() -> None:
    from asyncrl.config import AsyncRLConfig, GRPOConfig
    from asyncrl.controller.validation import failure_warnings

    def warnings(**ds) -> list[str]:
        return failure_warnings(GRPOConfig(dynamic_sampling={"filter": "zero_variance", **ds}),
                                AsyncRLConfig())

    assert any("max_gen_batches=1" in w for w in warnings(max_gen_batches=1))
    assert warnings(max_gen_batches=2) == warnings(max_gen_batches=1, batch_multiplier=1.5) == []


def test_the_budget_message_counts_the_rejections_it_stopped_at() -> None:
    """The message counts the groups filtered when the budget ran out; groups
    still generating are filtered as they finish, so the summary may count more:
    the message says so, and its numbers add up."""
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          task=FlatTask(1.0), steps=10, per_step=4,
                          dynamic_sampling={"filter": "zero_variance", "max_gen_batches": 1,
                                            "batch_multiplier": 1.5})
    with pytest.raises(DynamicSamplingBudgetExceeded) as err:
        run_virtual(ctl.run())
    message = str(err.value)
    assert ("dispatch batch 0 generated 6 groups (1 batch(es) of 6); once the filter "
            "'zero_variance' had rejected 3 of them, at most 3 could pass, fewer than the "
            "num_prompts_per_step=4 groups its step needs (groups still generating are "
            "filtered as they finish: summary.json counts those too)") in message, message
    assert ctl.summary()["dynamic_sampling"]["filtered"] >= 3
