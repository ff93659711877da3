"""Re-tuning the staleness contract mid-run (issue 38), in virtual time: random
valid setups with random re-plans at step boundaries, shrinks included, never
hang, lose a group or break a bound once the change took effect."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import random

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from asyncrl.controller.autoplan import PlanRequest, PlanResult, Prediction
from asyncrl.errors import RetuneRefused, SetupError
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import FORGIVING, make_controller
from tests.controller.test_deadlock_freedom import SAMPLER_WINDOW_KEY
from tests.controller.test_deterministic import PinnedEngine
from tests.fakes import FakeEngine, FakeTrainer


class RandomPlanner:
    """A planner whose every plan is a random setting predicted to win big (a
    shrink of window and capacity as likely as a raise; some the Retuner refuses)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.requests: list[PlanRequest] = []
        self.last: dict | None = None

    def submit(self, request: PlanRequest) -> concurrent.futures.Future:
        self.requests.append(request)
        rng, cur = self.rng, request.setting
        setting = {"max_inflight_prompts": rng.randint(1, 12),
                   "window": rng.randint(0, 3) if "window" in request.knobs else cur["window"],
                   "max_buffered_rollouts": rng.randint(1, 24)}
        if self.last is not None and rng.random() < 0.5:  # a second win in a row
            setting = self.last
        self.last = setting
        current = Prediction(cur, 1.0, 0.0, 0.0, True)
        best = Prediction(setting, 2.0, 0.0, 0.0, True)
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(PlanResult({}, [current, best], best, current, 0.0))
        return future

    def close(self) -> None:
        pass


class BoundChecker:
    """Watches every in-flight change of a run: once a bound was applied, no
    permit or slot is given above it (a shrink only lets the count fall)."""

    def __init__(self, ctl) -> None:
        self.ctl = ctl
        self.last_inflight = 0
        self.violations: list[str] = []
        stats = ctl.ctx.stats
        inner = stats.inflight_changed

        def observe(now: float, inflight: int) -> None:
            inner(now, inflight)
            self.check(inflight)

        stats.inflight_changed = observe

    def check(self, inflight: int) -> None:
        ctl, buf = self.ctl, self.ctl.buffer
        if inflight > self.last_inflight:  # a permit (and a slot) was just given
            if inflight > ctl.dispatcher.max_inflight:
                self.violations.append(f"{inflight} in flight > bound {ctl.dispatcher.max_inflight}")
            if len(buf) > buf.capacity_target:
                self.violations.append(f"{len(buf)} slots > capacity {buf.capacity_target}")
        if len(buf) > buf.capacity:
            self.violations.append(f"{len(buf)} slots > capacity {buf.capacity}")
        self.last_inflight = inflight


def _random_setting(rng: random.Random, ctl, per_step: int, min_chunk: int) -> dict[str, int]:
    window = rng.randint(0, 3)
    required = ctl.sampler.required_capacity_for(window, per_step) or 1
    capacity = max(required, min_chunk) + rng.choice([0, 0, 1, per_step])
    return {"max_inflight_prompts": rng.randint(1, 12), "window": window,
            "max_buffered_rollouts": capacity}


@st.composite
def setups(draw):
    name = draw(st.sampled_from(sorted(SAMPLER_WINDOW_KEY)))
    sampler = {"name": name, SAMPLER_WINDOW_KEY[name]: draw(st.integers(0, 3))}
    if name == "windowed":
        sampler["sample_freshest_first"] = draw(st.booleans())
    return {
        "sampler": sampler,
        "per_step": draw(st.integers(1, 6)),
        "capacity": draw(st.integers(1, 24)),
        "min_chunk": draw(st.integers(1, 8)),
        "inflight": draw(st.integers(1, 12)),
        "engines": draw(st.integers(1, 3)),
        "seed": draw(st.integers(0, 10_000)),
        "sigma": draw(st.sampled_from([0.0, 0.5, 1.5])),
        "failure_rate": draw(st.sampled_from([0.0, 0.0, 0.2])),
        "step_time": draw(st.sampled_from([0.1, 1.0, 5.0])),
        "replan_p": draw(st.sampled_from([0.0, 0.2, 0.5, 1.0])),
        # The aimd autopilot, or a model-based one whose plans are random settings
        # (shrinks of window and capacity included; those the Retuner refuses are
        # recorded, never applied), on top of the random re-plans (all go through
        # the Retuner).
        "autopilot": draw(st.sampled_from([
            None, {"enabled": True, "warmup_steps": 0, "replan_every_steps": 1, "increase": 3,
                   "bounds": {"max_waste_frac": 0.1}},
            {"enabled": True, "mode": "plan", "warmup_steps": 0, "replan_every_steps": 1,
             "wins_needed": 1, "min_gain": 0.0},
            {"enabled": True, "mode": "runtime", "warmup_steps": 1, "replan_every_steps": 2,
             "wins_needed": 2, "min_gain": 0.0}])),
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_random_replans_never_hang_lose_a_group_or_break_a_bound(setup) -> None:
    rng = random.Random(setup["seed"])
    per_step, min_chunk = setup["per_step"], setup["min_chunk"]

    def latency(_req) -> float:
        return rng.lognormvariate(0.0, setup["sigma"]) if setup["sigma"] else 1.0

    def fail(_req) -> bool:
        return rng.random() < setup["failure_rate"]

    steps = 14
    staleness_breaks: list[str] = []
    replans = []

    async def replan(ctl, version: int) -> None:
        record = ctl.step_records[-1]
        bound = ctl.sampler.max_staleness()  # declared for the step just trained
        if bound is not None and record["staleness_max"] > bound:
            staleness_breaks.append(f"step {record['step']}: {record['staleness_max']} > {bound}")
        if rng.random() < setup["replan_p"]:
            replans.append(ctl.retune(**_random_setting(rng, ctl, per_step, min_chunk)))

    pilot = setup["autopilot"]
    planner = RandomPlanner(rng) if pilot and pilot.get("mode") in ("plan", "runtime") else None
    try:
        ctl = make_controller(
            setup["sampler"], planner=planner,
            engines=[FakeEngine(latency, fail=fail) for _ in range(setup["engines"])],
            trainer=FakeTrainer(step_time=setup["step_time"]), steps=steps,
            per_step=per_step, capacity=setup["capacity"], min_chunk=min_chunk,
            inflight=setup["inflight"],
            rollout_failure={**FORGIVING, "max_infra_attempts_per_prompt": 2},
            **({"autopilot": setup["autopilot"]} if setup["autopilot"] else {}),
        )
        ctl.on_step_end = replan
    except SetupError:
        event("setup refused")
        return  # the deadlock-freedom test covers which setups are refused
    checker = BoundChecker(ctl)
    result = run_virtual(ctl.run())  # a deadlock raises (looptime's idle timeout)
    assert result.steps == steps
    summary = result.summary["ledger"]
    assert summary["balanced"] and summary["trained"] == steps * per_step
    assert checker.violations == []
    assert staleness_breaks == []
    if setup["autopilot"] is None:
        assert len(ctl.retuner.applied) == len(replans)
    if planner is not None:
        assert planner.requests and all(
            d["action"] in ("apply", "candidate", "hold", "refused")
            for d in ctl.autopilot.decisions)
        if pilot["mode"] == "runtime":
            assert all("window" not in r.knobs for r in planner.requests)
        event(f"{pilot['mode']}: {ctl.autopilot.changes} changes")
    event("ran with re-tunes applied" if ctl.retuner.applied else "ran without a re-tune")


def test_a_raised_inflight_bound_is_used_by_the_placer() -> None:
    async def raise_bound(ctl, version: int) -> None:
        if version == 1:
            ctl.retune(max_inflight_prompts=6)

    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2},
                          engines=[FakeEngine(lambda _r: 1.0)], steps=4, per_step=6,
                          capacity=12, min_chunk=1, inflight=1)
    ctl.on_step_end = raise_bound
    run_virtual(ctl.run())
    assert ctl.dispatcher.max_inflight == 6
    assert ctl.step_records[0]["inflight"] <= 1
    assert ctl.ctx.stats.max_inflight_seen == 6


def test_a_shrunk_inflight_bound_gives_no_permit_above_it() -> None:
    async def shrink(ctl, version: int) -> None:
        if version == 2:
            ctl.retune(max_inflight_prompts=2)

    ctl = make_controller({"name": "windowed", "max_staleness_versions": 2},
                          engines=[FakeEngine(lambda _r: 1.0)], steps=8, per_step=6,
                          capacity=18, min_chunk=1, inflight=8)
    ctl.on_step_end = shrink
    checker = BoundChecker(ctl)
    run_virtual(ctl.run())
    assert checker.violations == []
    assert all(r["inflight"] <= 2 for r in ctl.step_records[3:])
    assert ctl.summary()["ledger"]["balanced"]


def test_a_refused_retune_changes_nothing() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          per_step=4, capacity=8, min_chunk=2)
    before = ctl.retuner.current()
    with pytest.raises(RetuneRefused, match=r"max_buffered_rollouts=8 is below the 12 slots"):
        ctl.retune(window=2)
    with pytest.raises(RetuneRefused, match="max_inflight_prompts must be an integer >= 1"):
        ctl.retune(max_inflight_prompts=0)
    assert ctl.retuner.pending is None and ctl.retuner.current() == before
    windowed = make_controller({"name": "windowed"}, per_step=4, capacity=8, min_chunk=2)
    with pytest.raises(RetuneRefused, match="min_groups_for_streaming_train=2"):
        windowed.retune(max_buffered_rollouts=1)


def test_deterministic_mode_refuses_a_window_change() -> None:
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1},
                          engines=[PinnedEngine(lambda _r: 1.0)], deterministic=True)
    with pytest.raises(RetuneRefused, match="deterministic: true"):
        ctl.retune(window=0)


def test_the_window_shrinks_before_the_capacity_does() -> None:
    """A shrink of both: capacity stays what the held (old) window needs until
    the hold expires, then follows the request down."""
    seen: dict[int, tuple[int, int | None]] = {}

    async def shrink_both(ctl, version: int) -> None:
        seen[version] = (ctl.buffer.capacity_target, ctl.sampler.max_staleness())
        if version == 3:
            ctl.retune(window=0, max_buffered_rollouts=2)

    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 2},
                          engines=[FakeEngine(lambda _r: 1.0)], steps=10, per_step=2,
                          capacity=6, min_chunk=1)
    ctl.on_step_end = shrink_both
    checker = BoundChecker(ctl)
    run_virtual(ctl.run())
    assert seen[3] == (6, 2)
    # Applied at version 3 (after the hook): held until a boundary past 3 + 2.
    assert seen[4] == (6, 2) and seen[5] == (6, 2)
    assert seen[10] == (2, 0)
    assert checker.violations == [] and ctl.summary()["ledger"]["balanced"]


def _crash_and_resume(sampler: dict, retune: dict, *, retune_at: int, ckpt_at: int,
                      **kw):
    """Run, re-tune at ``retune_at``, checkpoint at ``ckpt_at``, crash; build a
    second controller from the same (original) config and load the checkpoint."""
    saved: dict = {}

    async def retune_then_snapshot(ctl, version: int) -> None:
        if version == retune_at:
            ctl.retune(**retune)
        if version == ckpt_at:
            saved["state"] = json.loads(json.dumps(ctl.state_dict()))
            saved["trainer"] = ctl.trainer.state_dict()

    first = make_controller(sampler, engines=[FakeEngine(lambda _r: 0.5)],
                            trainer=FakeTrainer(step_time=5.0), **kw)
    first.on_step_end = retune_then_snapshot

    async def crash() -> None:
        run = asyncio.ensure_future(first.run())
        while first.steps_done < ckpt_at:
            await first.buffer.wait_changed()
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run

    run_virtual(crash())
    trainer = FakeTrainer(step_time=5.0)
    trainer.load_state_dict(saved["trainer"])
    engine = FakeEngine(lambda _r: 0.5)
    engine.weight_version = ckpt_at
    second = make_controller(sampler, engines=[engine], trainer=trainer,
                             history=first.ledger.history, **kw)
    second.load_state_dict(saved["state"])
    return saved["state"], second


def test_a_resumed_run_keeps_the_retuned_setting() -> None:
    """Raise capacity, in-flight bound and window mid-run, checkpoint, resume from
    the original config: the re-tuned setting comes back (the buffer's slots fit)."""
    state, second = _crash_and_resume(
        {"name": "windowed", "max_staleness_versions": 1},
        {"max_buffered_rollouts": 24, "max_inflight_prompts": 12, "window": 3},
        retune_at=2, ckpt_at=6, steps=12, per_step=4, capacity=8, inflight=4, min_chunk=1)
    assert len(state["ready"]) > 8, "the checkpoint must hold more than the old capacity"
    assert (second.dispatcher.max_inflight, second.sampler.window,
            second.buffer.capacity_target) == (12, 3, 24)
    result = run_virtual(second.run())
    assert result.summary["ledger"]["balanced"] and result.steps == 12


def test_a_window_hold_survives_a_resume_and_then_expires() -> None:
    _, second = _crash_and_resume(
        {"name": "windowed", "max_staleness_versions": 3}, {"window": 1},
        retune_at=2, ckpt_at=3, steps=12, per_step=4, capacity=16, inflight=8, min_chunk=1)
    assert second.sampler.max_staleness() == 3, "held: groups started under 3 may be left"
    result = run_virtual(second.run())
    assert result.summary["ledger"]["balanced"]
    assert second.sampler.max_staleness() == 1
