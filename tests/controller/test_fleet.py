"""The controller's side of an elastic fleet (issue 35), in virtual time with a
fake elastic engine (tests/fleet_fakes.py): status, join at the newest weights,
drain, abort-and-continue from the prefix, the change hook and the errors."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.errors import FleetError
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.controller.test_autoplan import ScriptedPlanner
from tests.fakes import FakeEngine
from tests.fleet_fakes import FleetEngine
from tests.vtime import advance

WINDOWED = {"name": "windowed", "max_staleness_versions": 2}


def _run_with(ctl, at: float, command: dict):
    """Run ``ctl``; at virtual time ``at`` send ``command`` through its fleet control."""
    answers: list = []

    async def main():
        task = asyncio.ensure_future(ctl.run())
        await advance(at)
        answers.append(await ctl.fleet.handle(command))
        return await task

    return run_virtual(main(), loop="jump"), answers


def test_remove_with_abort_continues_the_groups_elsewhere_from_their_tokens() -> None:
    engine = FleetEngine(["http://a:1", "http://b:1"], latency=10.0, tokens=4)
    ctl = make_controller(WINDOWED, engines=[engine], steps=6, per_step=4, capacity=12,
                          inflight=8, min_chunk=4)
    result, answers = _run_with(ctl, 5.0, {"op": "remove", "url": "http://a:1", "abort": True})
    ledger = result.summary["ledger"]
    assert ledger["balanced"], ledger
    assert result.steps == 6
    # At t=5 server a held 4 groups, each halfway: 2 of 4 tokens per completion.
    handed = [a for a in engine.attempts if a[2] > 0]
    assert [(name, had) for name, _, had in handed] == [("http://b:1", 2)] * 4
    assert result.summary["groups_continued"] == 4
    assert all(name == "http://b:1" for name, _, _ in engine.attempts[8:])  # a takes no more
    # Continued, not regenerated: nothing after the removal restarted at 0 tokens
    # for a group that had tokens, and every attempt counted once per loss.
    assert sum(1 for _, _, had in engine.attempts if had == 0) == ledger["dispatched"]
    assert answers[0]["ok"] and any("http://a:1" in line and "gone" in line
                                    for line in answers[0]["lines"])


def test_remove_drains_by_default_letting_the_groups_finish() -> None:
    engine = FleetEngine(["http://a:1", "http://b:1"], latency=10.0, tokens=4)
    ctl = make_controller(WINDOWED, engines=[engine], steps=4, per_step=4, capacity=12,
                          inflight=8, min_chunk=4)
    result, answers = _run_with(ctl, 5.0, {"op": "remove", "url": "http://a:1"})
    assert result.summary["ledger"]["balanced"]
    assert result.summary["groups_continued"] == 0
    assert all(had == 0 for _, _, had in engine.attempts)  # nothing was handed over
    # The answer came once a's groups had finished (t=10): a was gone, b serving.
    rows = {line.split()[0]: line.split() for line in answers[0]["lines"][2:]
            if line.startswith("http")}
    assert rows["http://a:1"][-1] == "gone" and rows["http://b:1"][-1] == "healthy"


def test_a_joining_server_holds_the_newest_weights_before_its_first_group() -> None:
    """Added after two syncs, loading for 3 s (a sync meanwhile waits for it):
    in a synchronous run every group the new server runs starts at the version
    it holds, the first one included."""
    engine = FleetEngine(["http://a:1"], latency=10.0, tokens=4, load_s=3.0)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 0}, engines=[engine],
                          steps=6, per_step=2, capacity=4, inflight=4, min_chunk=2)
    fired: list[int] = []
    ctl.fleet.on_change.append(fired.append)
    result, answers = _run_with(ctl, 25.0, {"op": "add", "url": "http://c:1"})
    assert result.summary["ledger"]["balanced"]
    (name, loaded), = engine.joined
    assert name == "http://c:1" and loaded >= 2
    on_c = [(start, held) for who, start, held in engine.held if who == "http://c:1"]
    assert on_c and on_c[0][1] >= loaded
    assert all(start == held for start, held in on_c), on_c
    assert f"added http://c:1 at weight version {loaded}" in answers[0]["lines"]
    assert fired == [2]  # the change hook got the new slot count (one slot per member here)


def test_a_command_that_fails_part_way_still_tells_the_change_hooks() -> None:
    """Found in review: `scale 3` whose first server joined and second failed
    raised before the hooks (the autopilot's re-plan) heard of the new slot."""
    engine = FleetEngine(["http://a:1"], latency=10.0, tokens=4)
    ctl = make_controller(WINDOWED, engines=[engine], steps=4, per_step=2, capacity=8,
                          inflight=4, min_chunk=2)
    fired: list[int] = []
    ctl.fleet.on_change.append(fired.append)

    async def main():
        task = asyncio.ensure_future(ctl.run())
        await advance(5.0)
        with pytest.raises(FleetError, match="did not start"):
            await ctl.fleet.handle({"op": "scale", "size": 3})
        return await task

    result = run_virtual(main(), loop="jump")
    assert result.summary["ledger"]["balanced"]
    assert fired == [2]  # the server that did join is counted


def test_a_fleet_change_makes_the_autopilot_plan_for_the_new_fleet() -> None:
    # Its measurements so far describe the old fleet: it warms up again, and a
    # model-based mode plans for the new slot count.
    engine = FleetEngine(["http://a:1"], latency=10.0, tokens=4)
    ctl = make_controller(WINDOWED, engines=[engine], steps=6, per_step=2, capacity=8,
                          inflight=4, min_chunk=2, planner=ScriptedPlanner([]),
                          autopilot={"enabled": True, "mode": "runtime"})
    result, answers = _run_with(ctl, 25.0, {"op": "add", "url": "http://c:1"})
    assert answers[0]["ok"] and result.summary["ledger"]["balanced"]
    assert ctl.autopilot.rollout_slots == 2


def test_status_shows_each_engine_and_a_fixed_fleet_refuses_changes() -> None:
    ctl = make_controller(WINDOWED, engines=[FakeEngine(), FakeEngine()], steps=2)
    _, answers = _run_with(ctl, 0.5, {"op": "status"})
    lines = answers[0]["lines"]
    assert lines[1].split() == ["engine", "version", "in", "flight", "health"]
    assert [line.split()[:2] for line in lines[2:]] == [["engine", "0"], ["engine", "1"]]
    with pytest.raises(FleetError, match="fixed fleet"):
        run_virtual(ctl.fleet.handle({"op": "scale", "size": 3}))
    with pytest.raises(FleetError, match="unknown fleet command"):
        run_virtual(ctl.fleet.handle({"op": "grow"}))


@pytest.mark.parametrize(("command", "message"), [
    ({"op": "add", "url": "http://not-a-server:9"}, "no vLLM server answers"),
    ({"op": "remove", "url": "http://b:1"}, "below min_servers"),
    ({"op": "remove", "url": "http://z:1"}, "not a server of this run"),
    ({"op": "scale", "size": -1}, "whole number >= 0"),
])
def test_a_refused_command_leaves_the_run_unaffected(command, message) -> None:
    engine = FleetEngine(["http://b:1"], latency=1.0, tokens=2)
    ctl = make_controller(WINDOWED, engines=[engine], steps=3, per_step=2, capacity=6,
                          inflight=4, min_chunk=2)
    errors: list[str] = []

    async def main():
        task = asyncio.ensure_future(ctl.run())
        await advance(0.5)
        try:
            await ctl.fleet.handle(command)
        except FleetError as exc:
            errors.append(str(exc))
        return await task

    result = run_virtual(main(), loop="jump")
    assert len(errors) == 1 and message in errors[0]
    assert result.steps == 3 and result.summary["ledger"]["balanced"]
    assert [m.health for m in engine.fleet.members()] == ["healthy"]


def test_more_slots_than_the_inflight_bound_is_noted() -> None:
    engine = FleetEngine(["http://a:1"], latency=1.0, tokens=2)
    ctl = make_controller(WINDOWED, engines=[engine], steps=3, per_step=2, capacity=6,
                          inflight=1, min_chunk=2)
    _, answers = _run_with(ctl, 0.5, {"op": "add", "url": "http://c:1"})
    assert any("max_inflight_prompts=1 is below the fleet's 2 generation slots" in line
               for line in answers[0]["lines"])
