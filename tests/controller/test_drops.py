"""What becomes of a prompt that runs out of attempts: replace or shrink, for
every sampler, never below the step floor, within the failure budgets."""

from __future__ import annotations

import collections
import json
import re

import pytest

from asyncrl.config.failures import RolloutFailureConfig
from asyncrl.controller.drops import DropPolicy
from asyncrl.controller.entry import Entry
from asyncrl.errors import GenerationError, RewardError, TooManyFailedGroups
from asyncrl.sim.clock import run_virtual
from asyncrl.types import Prompt
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTask, FakeTrainer, InlineScorer, lognormal_latency

N = 4
SAMPLERS = [
    {"name": "in_order", "max_lookahead_versions": 1},
    {"name": "weight_fifo", "max_staleness_versions": 1},
    {"name": "ready_first", "max_staleness_versions": 2},
    {"name": "windowed", "max_staleness_versions": 2},
]


def always_failing(prompt: Prompt) -> bool:
    """10% of the prompts fail every time (their data is bad)."""
    return prompt.prompt_id % 10 == 7


def run_with_bad_prompts(sampler: dict, steps: int = 12, **failure) -> tuple:
    task = FakeTask()
    ctl = make_controller(sampler, task=task, scorer=InlineScorer(task, fail=always_failing),
                          engines=[FakeEngine(lognormal_latency(3, sigma=0.7))], steps=steps,
                          per_step=N, capacity=3 * N, min_chunk=2,
                          rollout_failure={"max_skipped_prompts": 1000, **failure})
    return ctl, run_virtual(ctl.run())


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_replace_trains_every_step_at_full_batch_size(sampler) -> None:
    ctl, result = run_with_bad_prompts(sampler, on_dropped_prompt="replace",
                                       max_replacement_attempts=2)
    assert result.steps == 12 and result.summary["ledger"]["balanced"]
    assert [r["groups_trained"] for r in ctl.step_records] == [N] * 12
    failures = result.summary["failures"]
    assert failures["prompts_skipped"] == failures["prompts_replaced"] > 0
    assert result.summary["ledger"]["failed_data"] == failures["prompts_skipped"]
    if sampler["name"] == "in_order":  # a replacement keeps the dropped group's stamp
        for rec in ctl.ledger.records():
            if rec.state == "trained":
                assert rec.target_step == rec.end_step


@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_shrink_trains_at_the_floor_or_above_and_never_strands_a_step(sampler) -> None:
    ctl, result = run_with_bad_prompts(sampler, min_step_batch_fraction=0.5)
    assert result.steps == 12 and result.summary["ledger"]["balanced"]
    sizes = [r["groups_trained"] for r in ctl.step_records]
    assert all(N // 2 <= s <= N for s in sizes) and min(sizes) < N, sizes
    failures = result.summary["failures"]
    assert N * 12 - sum(sizes) == failures["groups_shrunk"] <= failures["prompts_skipped"]
    assert failures["steps_shrunk"] == sum(s < N for s in sizes)


def test_a_step_below_the_floor_stops_the_run_naming_the_budget() -> None:
    with pytest.raises(TooManyFailedGroups, match=r"below the floor of 4 .*"
                                                  r"min_step_batch_fraction=0\.9") as err:
        run_with_bad_prompts(SAMPLERS[0])
    assert "on_dropped_prompt: replace" in str(err.value)
    assert isinstance(err.value.__cause__, RewardError)


def test_the_skip_budget_names_the_reward_fix_without_saying_it_raised() -> None:
    # A reward that returned nan raised nothing: the fix must fit it as well.
    with pytest.raises(TooManyFailedGroups) as err:
        run_with_bad_prompts(SAMPLERS[0], max_skipped_prompts=0)
    assert "Fix the reward function (the error says what went wrong)" in str(err.value)


BUDGETS = {
    # One skip too many: the first prompt that fails for good stops the run.
    "skips": {},
    # Every prompt from 20 on fails: the third loss of a step breaks its floor of 2.
    "floor": {"max_skipped_prompts": 1000, "min_step_batch_fraction": 0.5},
}


@pytest.mark.parametrize("budget", BUDGETS, ids=str)
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_a_run_a_budget_stopped_resumes_once_the_cause_is_fixed(sampler, budget) -> None:
    # The reward breaks from prompt 20 on and the run stops with TooManyFailedGroups.
    # The group that used the budget up is not dropped: it stays pending, so no step
    # of the stopped run is cut short or left empty, and the run resumed after the
    # fix retries it - its step does not wait for a group that will never come.
    broken = [True]
    task = FakeTask()
    kw = {"per_step": N, "capacity": 3 * N, "min_chunk": 2, "steps": 12,
          "rollout_failure": BUDGETS[budget]}

    def make(**extra):
        return make_controller(
            sampler, task=task, **kw, **extra,
            scorer=InlineScorer(task, fail=lambda p: broken[0] and p.prompt_id >= 20))

    first = make(engines=[FakeEngine(lognormal_latency(3, sigma=0.7))])
    with pytest.raises(TooManyFailedGroups) as err:
        run_virtual(first.run())
    last = int(re.search(r"group \d+, prompt (\d+)", str(err.value)).group(1))
    assert first.stopped_at_safe_point and first.version.value < 12
    assert all(r["groups_trained"] >= N // 2 for r in first.step_records), first.step_records
    state = json.loads(json.dumps(first.state_dict()))
    pending = {d["prompt"]["prompt_id"] for d in state["dispatch"]["inflight"]}
    assert last in pending  # the group that used the budget up
    assert pending == {rec.prompt_id for rec in first.ledger.records() if rec.state == "inflight"}

    broken[0] = False  # the fix
    trainer = FakeTrainer()
    trainer.load_state_dict(first.trainer.state_dict())
    engine = FakeEngine(lognormal_latency(4, sigma=0.7))
    engine.weight_version = state["trainer_version"]
    second = make(engines=[engine], trainer=trainer, history=first.ledger.history)
    second.load_state_dict(state)
    result = run_virtual(second.run())
    ledger = result.summary["ledger"]
    assert result.steps == 12 and ledger["balanced"], ledger
    sizes = [r["groups_trained"] for r in first.step_records + second.step_records]
    assert len(sizes) == 12 and min(sizes) >= N // 2, sizes
    ends = collections.Counter(rec.state for rec in second.ledger.records())
    # Only skips within the budget failed for good; the groups that stopped the run trained.
    assert ends["failed"] == result.summary["failures"]["prompts_skipped"]
    trained = {rec.prompt_id for rec in second.ledger.records() if rec.state == "trained"}
    assert pending <= trained


def test_replace_falls_back_to_shrinking_when_its_attempts_run_out() -> None:
    # Prompts 7 and the spare after it both fail: one replacement attempt per
    # lost group is not enough, so the step shrinks (a floor of 3 allows it).
    task = FakeTask()
    ctl = make_controller(SAMPLERS[0], task=task, per_step=N, capacity=2 * N, steps=6,
                          scorer=InlineScorer(task, fail=lambda p: p.prompt_id in (7, 8)),
                          rollout_failure={"max_skipped_prompts": 10, "min_step_batch_fraction": 0.75,
                                           "on_dropped_prompt": "replace"})
    result = run_virtual(ctl.run())
    assert result.steps == 6
    assert sorted(r["groups_trained"] for r in ctl.step_records) == [3] + [N] * 5
    outcomes = {d["prompt_id"]: d["outcome"] for d in result.summary["failures"]
                ["dropped_prompts"]}
    assert outcomes == {7: "replaced", 8: "step 1 shrank"}


def test_an_infra_outage_shorter_than_the_budget_is_ridden_out() -> None:
    # From prompt 19 on, four attempts in a row fail (one group at a time): two
    # prompts in a row are dropped, then a commit resets the count. A budget of
    # one would have stopped the run.
    outage = {"attempts_left": 4}

    def fail(request) -> bool:
        if request.prompt.prompt_id >= 19 and outage["attempts_left"]:
            outage["attempts_left"] -= 1
            return True
        return False

    def run(budget: int):
        outage["attempts_left"] = 4
        ctl = make_controller(SAMPLERS[0], engines=[FakeEngine(1.0, fail=fail)], per_step=N,
                              capacity=2 * N, inflight=1, steps=10,
                              rollout_failure={"max_infra_attempts_per_prompt": 2,
                                               "max_consecutive_dropped_prompts": budget,
                                               "on_dropped_prompt": "replace",
                                               "max_replacement_attempts": 3})
        return ctl, run_virtual(ctl.run())

    ctl, result = run(budget=2)
    assert result.steps == 10 and result.summary["ledger"]["failed_infra"] == 2
    assert ctl.ctx.drops.consecutive == 0
    with pytest.raises(TooManyFailedGroups, match="max_consecutive_dropped_prompts=1"):
        run(budget=1)


def test_drop_state_survives_a_checkpoint() -> None:
    cfg = RolloutFailureConfig(on_dropped_prompt="replace", max_skipped_prompts=5)
    drops = DropPolicy(cfg, N)
    pool = iter(Prompt(i, f"p{i}") for i in range(100, 200))
    replacement = drops.drop(Entry(Prompt(1, "p1"), 3, None, group_id=1, batch_index=3), "data",
                             RewardError("bad"), step=2,
                             draw=lambda k: [next(pool) for _ in range(k)])
    assert replacement is not None and replacement.stamp == 3 and replacement.replacements == 1
    shrunk = DropPolicy(RolloutFailureConfig(min_step_batch_fraction=0.5,
                                             max_consecutive_dropped_prompts=3), N)
    assert shrunk.drop(Entry(Prompt(2, "p2"), None, None, group_id=2, batch_index=1), "infra",
                       GenerationError("x"), step=4, draw=lambda k: []) is None
    assert shrunk.quota(4) == N - 1  # unstamped, its batch's step gone by: the step in progress
    for policy in (drops, shrunk):
        copy = DropPolicy(policy.cfg, N)
        copy.load_state_dict(policy.state_dict())
        assert copy.state_dict() == policy.state_dict()
    assert [p.prompt_id for p in drops.spares] == [101, 102, 103]


def run_finite(sampler: dict, failing: set[int], *, prompts: int | None = 10, steps: int = 50,
               per_step: int = 2) -> tuple:
    """A run over ``prompts`` prompts (None: endless) in which the prompts in
    ``failing`` always fail their reward, replaced from a reserve of 2 spares."""
    task = FakeTask(prompts)
    ctl = make_controller(sampler, task=task, per_step=per_step, capacity=4 * per_step,
                          steps=steps, scorer=InlineScorer(task, fail=lambda p: p.prompt_id in
                                                           failing),
                          rollout_failure={"max_skipped_prompts": 10, "min_step_batch_fraction": 0.5,
                                           "on_dropped_prompt": "replace",
                                           "replacement_reserve_prompts": 2})
    return ctl, run_virtual(ctl.run())


# windowed admits all 10 prompts before the first drop (no spares are drawn), so
# two drops in one batch shrink that step of 2 below its floor: left out.
FINITE = [(sampler, failing) for sampler in SAMPLERS for failing in ({1, 2}, {2, 7}, {0, 4})
          if (sampler["name"], failing) != ("windowed", {1, 2})]


@pytest.mark.parametrize(("sampler", "failing"), FINITE,
                         ids=lambda x: x["name"] if isinstance(x, dict) else str(sorted(x)))
def test_a_finite_source_trains_every_prompt_it_drew(sampler, failing) -> None:
    # Each drop draws a dispatch batch of spares; when the 10 prompts run out the
    # spares left in the pool go into the last batches instead of being stranded.
    ctl, result = run_finite(sampler, failing)
    assert result.stop_reason in ("source_exhausted", "incomplete_step")
    ends: dict[str, set[int]] = {}
    for rec in ctl.ledger.records():
        ends.setdefault(rec.state, set()).add(rec.prompt_id)
    assert ends.pop("failed") == failing
    # windowed evicts what grew too stale (max_staleness_versions): an end, with its reason.
    evicted = ends.pop("evicted", set())
    assert sampler["name"] == "windowed" or not evicted
    assert ends.pop("trained") | evicted == set(range(10)) - failing
    assert not ends  # nothing pending
    prompts = result.summary["prompts"]
    assert prompts["drawn"] == prompts["dispatched"] == 10
    assert prompts["untrained"] == {"pending": 0, "queued": [], "spare": [], "lookahead": []}
    assert prompts["untrained_reason"] == ""


def test_prompts_a_stopped_run_left_untrained_are_listed_with_the_reason() -> None:
    # An endless source stopped at max_num_steps: the spare pool (and the prompts
    # admitted or read ahead) hold prompts no group trained; the summary names them.
    ctl, result = run_finite(SAMPLERS[0], {1}, prompts=None, steps=3)
    prompts = result.summary["prompts"]
    untrained = prompts["untrained"]
    assert untrained["spare"], untrained  # the drop drew two spares and used one
    read = ctl.dispatcher.source.source.position  # what the task's source handed out
    listed = [*untrained["queued"], *untrained["spare"], *untrained["lookahead"]]
    dispatched = [rec.prompt_id for rec in ctl.ledger.records()]
    assert sorted(dispatched + listed) == list(range(read))
    assert prompts["drawn"] == read and prompts["dispatched"] == len(dispatched)
    pending = [rec for rec in ctl.ledger.records() if rec.state in ("inflight", "ready")]
    assert untrained["pending"] == len(pending)
    assert "max_num_steps" in prompts["untrained_reason"]
    copy = make_controller(SAMPLERS[0], per_step=2, capacity=8)
    copy.load_state_dict(ctl.state_dict())
    assert copy.summary()["prompts"]["drawn"] == read
    assert copy.dispatcher.undispatched() == ctl.dispatcher.undispatched()


class LocatedTask(FakeTask):
    """A task whose prompts say where they came from, as a dataset task's do."""

    def prompt_source(self, seed: int):
        source = super().prompt_source(seed)
        pop = source.next_prompt

        def located() -> Prompt | None:
            p = pop()
            return None if p is None else Prompt(p.prompt_id, p.text, p.answer,
                                                 {"source": f"data.jsonl line {p.prompt_id + 1}"})

        source.next_prompt = located
        return source


def test_a_group_a_used_up_budget_put_back_says_why_it_is_pending() -> None:
    # A user trial: after a reward that always raised, every ledger line said
    # "inflight" with error null; why the group was pending was only in the stop.
    task = LocatedTask()
    ctl = make_controller(SAMPLERS[0], task=task, steps=3, per_step=N,
                          scorer=InlineScorer(task, fail=lambda p: p.prompt_id == 1))
    with pytest.raises(TooManyFailedGroups) as err:
        run_virtual(ctl.run())
    # A step of 4 may not shrink at min_step_batch_fraction 0.9: raising
    # max_skipped_prompts alone would stop the run at the floor instead.
    assert ("raise max_skipped_prompts together with on_dropped_prompt: replace (a step of "
            "num_prompts_per_step=4 may not shrink: min_step_batch_fraction=0.9 puts its "
            "floor at 4) to skip such prompts") in str(err.value)
    assert "group 1, prompt 1 (data.jsonl line 2): RewardError" in str(err.value)
    group = ctl.ledger[1]
    assert group.state == "inflight"  # pending: the resumed run retries it
    assert group.last_error == "RewardError: injected reward failure for prompt 1"
    assert group.last_error_kind == "data" and group.source == "data.jsonl line 2"
    ok = next(r for r in ctl.ledger.records() if r.prompt_id == 0)
    assert ok.last_error is ok.last_error_kind is ok.source is None  # never failed: no look-up


def test_a_budget_that_can_shrink_a_step_says_only_to_raise_it() -> None:
    task = FakeTask()
    ctl = make_controller(SAMPLERS[0], task=task, steps=3, per_step=N,
                          scorer=InlineScorer(task, fail=lambda p: p.prompt_id == 1),
                          rollout_failure={"min_step_batch_fraction": 0.5})
    with pytest.raises(TooManyFailedGroups, match=r"or raise max_skipped_prompts to skip such "
                                                  r"prompts$"):
        run_virtual(ctl.run())


def test_a_skipped_prompt_is_listed_with_where_it_came_from() -> None:
    task = LocatedTask()
    ctl = make_controller(SAMPLERS[0], task=task, steps=2, per_step=N,
                          scorer=InlineScorer(task, fail=lambda p: p.prompt_id == 1),
                          rollout_failure={"max_skipped_prompts": 1,
                                           "on_dropped_prompt": "replace"})
    result = run_virtual(ctl.run())
    (dropped,) = result.summary["failures"]["dropped_prompts"]
    assert dropped["prompt_id"] == 1 and dropped["source"] == "data.jsonl line 2"
    (failed,) = [r for r in ctl.ledger.records() if r.state == "failed"]
    assert failed.source == "data.jsonl line 2" and failed.last_error_kind == "data"
