"""Stop reasons are a type (issue 30, item 3): the controller reports a
StopReason member, its summary the member's plain value, and a caller's own
reason stays the string it gave."""

from __future__ import annotations

import json

from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller

IN_ORDER = {"name": "in_order", "max_lookahead_versions": 0}


def test_the_controller_reports_a_stop_reason_member_and_the_summary_its_value() -> None:
    from asyncrl.types import StopReason

    ctl = make_controller(IN_ORDER, steps=2)
    assert ctl.stop_reason is StopReason.NOT_STARTED
    result = run_virtual(ctl.run())
    assert ctl.stop_reason is StopReason.MAX_NUM_STEPS
    assert result.stop_reason is StopReason.MAX_NUM_STEPS
    # The summary holds the plain string (summary.json, the CLI's exit code read it).
    assert type(result.summary["stop_reason"]) is str
    assert json.loads(json.dumps(result.summary))["stop_reason"] == "max_num_steps"
    assert f"{StopReason.STALLED}" == "stalled" and StopReason("stalled") is StopReason.STALLED


def test_a_request_without_a_reason_stops_with_stopped_and_a_callers_reason_is_kept() -> None:
    from asyncrl.types import StopReason

    for reason, expected in ((None, StopReason.STOPPED), ("time budget", "time budget")):
        ctl = make_controller(IN_ORDER, steps=10)
        if reason is None:
            ctl.request_stop()
        else:
            ctl.request_stop(reason, "out of time")
        result = run_virtual(ctl.run())
        assert result.stop_reason == expected and result.summary["stop_reason"] == expected
        assert result.steps == 0
