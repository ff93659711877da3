"""Setup validation, the stall watchdog and the ledger's own checks."""

from __future__ import annotations

import re

import pytest

from asyncrl.controller import Ledger, LedgerError, derived_facts
from asyncrl.errors import SetupError
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine


@pytest.mark.parametrize(
    ("sampler", "capacity", "needed"),
    [
        ({"name": "in_order", "max_lookahead_versions": 2}, 11, 12),
        ({"name": "weight_fifo", "max_staleness_versions": 1}, 7, 8),
        ({"name": "ready_first", "max_staleness_versions": 0}, 3, 4),
    ],
)
def test_capacity_below_the_samplers_requirement_is_refused(sampler, capacity, needed) -> None:
    with pytest.raises(SetupError) as err:
        make_controller(sampler, capacity=capacity, min_chunk=1)
    message = str(err.value)
    assert f"max_buffered_rollouts={capacity}" in message and f">= {needed}" in message


def test_windowed_needs_room_for_one_streaming_chunk() -> None:
    with pytest.raises(SetupError, match="min_groups_for_streaming_train=6"):
        make_controller({"name": "windowed", "max_staleness_versions": 1}, capacity=5, min_chunk=6)
    make_controller({"name": "windowed", "max_staleness_versions": 1}, capacity=6, min_chunk=6)


def test_derived_facts() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 2}, capacity=12)
    facts = derived_facts(ctl.sampler, ctl.grpo)
    assert facts == {"sampler": "InOrderSampler", "is_on_policy": False,
                     "required_buffer_capacity": 12, "max_staleness": 2,
                     "staleness_measure": "start_weight", "max_end_staleness": 2,
                     "filter": "none", "groups_per_batch": 4,
                     "max_groups_generated_per_batch": 4, "surplus": None}
    ctl = make_controller({"name": "windowed", "max_staleness_versions": 3,
                           "staleness_of": "end_weight"}, capacity=12)
    facts = derived_facts(ctl.sampler, ctl.grpo)
    assert (facts["staleness_measure"], facts["max_staleness"], facts["max_end_staleness"]) == (
        "end_weight", None, 3)


def test_deterministic_runs_refuse_end_weight_staleness() -> None:
    sampler = {"name": "weight_fifo", "max_staleness_versions": 1, "staleness_of": "end_weight"}
    with pytest.raises(SetupError, match="staleness_of: start_weight, or deterministic: false"):
        make_controller(sampler, capacity=12, deterministic=True)


def test_stall_watchdog_names_what_the_controller_waits_for() -> None:
    hung = FakeEngine(latency=lambda r: 1e9 if r.prompt.prompt_id == 2 else 1.0)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 0}, engines=[hung],
                          steps=3, stall_watchdog={"stall_timeout_s": 60.0, "interval_s": 10.0,
                                                    "stall_action": "abort"})
    result = run_virtual(ctl.run())
    assert result.stop_reason == "stalled"
    assert re.search(r"rollout side stalled: the train pump waits for groups of step 0 "
                     r"\(0 ready; .*1 in flight", ctl.stop_message), ctl.stop_message


def test_ledger_refuses_a_second_terminal_state() -> None:
    ledger = Ledger()
    ledger.dispatch("g", prompt_id=0, target_step=None, start_weight=0, time=0.0)
    ledger.committed("g", end_weight=0, attempts=1, time=1.0)
    ledger.trained("g", step=0, staleness=0)
    with pytest.raises(LedgerError, match="exactly one state"):
        ledger.evicted("g", step=1)


def test_ledger_balance_detects_a_lost_group() -> None:
    ledger = Ledger()
    for gid in ("a", "b"):
        ledger.dispatch(gid, prompt_id=0, target_step=None, start_weight=0, time=0.0)
    ok, why = ledger.check_balance({"a"})
    assert not ok and "'b'" in why
    assert ledger.check_balance({"a", "b"})[0]
