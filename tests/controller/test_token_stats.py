"""Token-level staleness of a training step, from the trained groups' records."""

from __future__ import annotations

import pytest

from asyncrl.buffer import Slot
from asyncrl.controller.stats import RunStats, hist_quantile, token_facts
from asyncrl.types import Completion, GroupResult, Prompt, Rollout
from tests.fakes import FakeEngine, FakeTrainer
from tests.vtime import run_virtual

from .conftest import make_controller


def slot(start: int, *versions: list[int]) -> tuple[Slot, int]:
    completions = [Completion.of([1] * len(v), [0.0] * len(v), v, "stop") for v in versions]
    result = GroupResult("g", [0], completions, start)
    s = Slot("g", start, 0, ready=True, end_weight=result.end_weight,
             payload=Rollout("g", Prompt(0, ""), result, [0.0] * len(versions)))
    return s, 0


def test_token_facts_by_hand():
    # Step 6: a straggler started at 2 (tokens 2, 2, 4, 5) and a fresh group at 5.
    facts = token_facts([slot(2, [2, 2, 4, 5], [2]), slot(5, [5, 5])], step=6)
    assert facts["token_staleness_hist"] == {"1": 3, "2": 1, "4": 3}
    assert facts["train/token_staleness_mean"] == pytest.approx((3 * 1 + 2 + 3 * 4) / 7)
    assert facts["train/token_staleness_max"] == 4
    assert facts["train/token_staleness_p95"] == 4
    assert facts["train/tokens_after_update_frac"] == pytest.approx(2 / 7)
    assert facts["train/group_version_span_mean"] == pytest.approx(1.5)
    assert facts["train/group_version_span_max"] == 3
    assert hist_quantile({0: 95, 7: 5}, 0.95) == 0  # the 95th percentile of the counts


def test_a_run_reports_token_staleness_per_step_and_in_the_summary():
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 3,
                           "staleness_of": "end_weight"}, engines=[FakeEngine(2.5)],
                          trainer=FakeTrainer(step_time=1.0), steps=6)
    result = run_virtual(ctl.run())
    records = ctl.step_records
    assert all("train/token_staleness_p95" in r for r in records)
    # FakeEngine's one token per completion is sampled at the end: staleness is
    # the age of the newest tokens, at most the window.
    assert max(r["train/token_staleness_max"] for r in records) <= 3
    totals = {k: v for k, v in result.summary.items() if k.startswith("token_staleness")}
    assert totals["token_staleness_max"] == max(int(k) for k in totals["token_staleness_hist"])
    assert sum(totals["token_staleness_hist"].values()) == 6 * ctl.grpo.num_prompts_per_step * (
        ctl.grpo.num_generations_per_prompt)
    assert RunStats(1).totals(0.0)["groups_continued"] == 0
