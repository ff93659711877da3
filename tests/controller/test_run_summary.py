"""The run summary is typed (issue 30, item 3): the controller's summary has
exactly the keys RunSummary declares, and summary.json only keys RunDirSummary
declares."""

from __future__ import annotations

from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller

IN_ORDER = {"name": "in_order", "max_lookahead_versions": 0}


def test_the_controllers_summary_has_exactly_the_declared_keys() -> None:
    from asyncrl.controller import RunDirSummary, RunSummary

    result = run_virtual(make_controller(IN_ORDER, steps=2).run())
    assert set(result.summary) == RunSummary.__required_keys__
    # What asyncrl train adds is optional, the controller's keys stay required.
    assert RunDirSummary.__required_keys__ == RunSummary.__required_keys__
    assert RunDirSummary.__optional_keys__ == {"final_dir", "final_note", "target_reward",
                                               "reached_target", "run_dir", "resume_command",
                                               "plots", "best_checkpoint", "autopilot",
                                               "startup_s"}
    piloted = run_virtual(make_controller(IN_ORDER, steps=2, autopilot={"enabled": True}).run())
    assert set(piloted.summary) == RunSummary.__required_keys__ | {"autopilot"}
