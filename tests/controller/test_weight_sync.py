"""Weight sync ordering, aborts of hopeless groups, cache invalidation."""

from __future__ import annotations

import pytest

from asyncrl.errors import BackendBug
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, lognormal_latency


class VersionCheckingEngine(FakeEngine):
    """Fails the test if the controller's version runs ahead of the engine's weights."""

    def __init__(self, controller_ref, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.controller_ref = controller_ref
        self.violations = 0

    async def generate(self, request):
        if self.controller_ref and self.weight_version < self.controller_ref[0].version.value:
            self.violations += 1
        return await super().generate(request)


def test_version_advances_only_after_the_engines_hold_the_new_weights() -> None:
    ref: list = []
    engine = VersionCheckingEngine(ref, lognormal_latency(2))
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1}, engines=[engine],
                          steps=30, capacity=8)
    ref.append(ctl)
    run_virtual(ctl.run())
    assert engine.violations == 0
    assert engine.versions_seen == list(range(1, 31))
    # Every group dispatched at version v started with weights >= v.
    assert all(r.start_weight <= (r.end_weight or r.start_weight) for r in ctl.ledger.records())


@pytest.mark.parametrize("name", ["windowed", "weight_fifo"])
def test_aborts_only_groups_the_sampler_calls_hopeless(name: str) -> None:
    engine = FakeEngine(lognormal_latency(7, median=1.0, sigma=1.5))
    ctl = make_controller({"name": name, "max_staleness_versions": 0}, engines=[engine],
                          trainer=FakeTrainer(step_time=0.5), steps=40, capacity=10, inflight=10)
    result = run_virtual(ctl.run())
    aborted = [r for r in ctl.ledger.records() if r.state == "aborted"]
    assert result.summary["ledger"]["balanced"]
    if name == "windowed":
        assert aborted, "long tails at window 0 must produce aborts"
    for rec in aborted:
        # Aborted right after the sync that made it hopeless: start < v - s.
        assert rec.start_weight < ctl.version.value
        assert rec.group_id in engine.aborted
    assert sum(m["groups_aborted"] for m in ctl.step_records) == len(aborted)


@pytest.mark.parametrize("name", ["in_order", "ready_first"])
def test_gated_policies_never_abort(name: str) -> None:
    key = "max_lookahead_versions" if name == "in_order" else "max_staleness_versions"
    engine = FakeEngine(lognormal_latency(7, sigma=1.5))
    ctl = make_controller({"name": name, key: 1}, engines=[engine], steps=30, capacity=10)
    run_virtual(ctl.run())
    assert ctl.ledger.counts()["aborted"] == 0
    # The only groups the engine was told to drop are those still generating at shutdown.
    assert set(engine.aborted) == {s.group_id for s in ctl.buffer.slots() if not s.ready}


@pytest.mark.parametrize(
    ("sampler", "flag", "expected"),
    [
        ({"name": "in_order", "max_lookahead_versions": 0}, True, 10),
        ({"name": "in_order", "max_lookahead_versions": 0}, False, 10),
        ({"name": "in_order", "max_lookahead_versions": 1}, True, 10),
        ({"name": "in_order", "max_lookahead_versions": 1}, False, 0),
        ({"name": "windowed", "max_staleness_versions": 0}, False, 10),
        ({"name": "ready_first", "max_staleness_versions": 2}, True, 10),
        ({"name": "ready_first", "max_staleness_versions": 2}, False, 0),
    ],
)
def test_cache_invalidation_when_on_policy_or_asked(sampler, flag, expected) -> None:
    # On-policy: no cache may outlive the weights that computed it. Off-policy:
    # only when recompute_kv_cache_after_weight_updates asks for it.
    engines = [FakeEngine(1.0), FakeEngine(1.0)]
    ctl = make_controller(sampler, engines=engines, steps=10, capacity=12,
                          recompute_kv_cache_after_weight_updates=flag)
    run_virtual(ctl.run())
    assert [e.invalidations for e in engines] == [expected, expected]


class LoadFails(FakeEngine):
    """update_weights raises from version ``at`` on (the trial's UpdateRaises)."""

    def __init__(self, at: int) -> None:
        super().__init__(1.0)
        self.at = at

    async def update_weights(self, weights, version: int) -> None:
        if version >= self.at:
            raise RuntimeError("weight load failed: shape mismatch")
        await super().update_weights(weights, version)


@pytest.mark.parametrize("steps", [10, 3], ids=["mid_run", "last_step"])
def test_a_failed_weight_load_is_the_engines_bug_and_stops_at_a_safe_point(steps) -> None:
    """The trainer finished step 2 when engine 1 fails to load weights 3: the step
    is whole, so it counts, the version advances with the trainer's, and the run
    stops at that step's end with its state whole (checkpointable), naming the engine."""
    engines = [FakeEngine(1.0), LoadFails(at=3)]
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 1}, engines=engines,
                          steps=steps)
    with pytest.raises(BackendBug) as caught:
        run_virtual(ctl.run())
    text = str(caught.value)
    assert text.startswith("engine 1 (tests.controller.test_weight_sync.LoadFails) raised "
                           "RuntimeError: weight load failed: shape mismatch in "
                           "update_weights(weights, 3) after training step 2")
    assert "resume the run from its checkpoint" in text and "\n" not in text
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert ctl.stopped_at_safe_point and ctl.stop_reason == "error"
    assert ctl.stop_message.startswith("BackendBug: engine 1 ")
    assert ctl.steps_done == 3 and ctl.version.value == 3
    assert ctl.state_dict()["trainer_version"] == 3
    assert engines[0].versions_seen == [1, 2, 3]  # the other engine's load finished
