"""Random setups that pass validation must finish; the others must be refused.

Under virtual time a deadlock cannot hang the test: the loop goes idle with no
timer pending and looptime raises IdleTimeoutError into every task.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asyncrl.errors import SetupError, TooManyFailedGroups
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import FORGIVING, make_controller
from tests.fakes import FakeEngine, FakeTrainer, FlatTask

SAMPLER_WINDOW_KEY = {
    "in_order": "max_lookahead_versions",
    "weight_fifo": "max_staleness_versions",
    "windowed": "max_staleness_versions",
    "ready_first": "max_staleness_versions",
}


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
        "chunk_time": draw(st.sampled_from([0.0, 0.3])),
        "on_dropped_prompt": draw(st.sampled_from(["replace", "shrink"])),
        # grpo.dynamic_sampling: the share of groups without signal (filtered at
        # commit when > 0) and the sampler's over-sampling.
        "filter_rate": draw(st.sampled_from([0.0, 0.0, 0.5, 0.9])),
        "batch_multiplier": draw(st.sampled_from([1.0, 1.0, 1.5, 2.0])),
    }


@st.composite
def over_sampled_setups(draw):
    """Dynamic sampling near the capacity rule's edge: a gated sampler looking
    ahead, most groups filtered, over-sampled batches, and a capacity between
    what plain batches and what whole over-sampled batches need."""
    name = draw(st.sampled_from(["in_order", "weight_fifo", "ready_first"]))
    window = draw(st.integers(1, 2))
    per_step = draw(st.integers(2, 5))
    return {
        "sampler": {"name": name, SAMPLER_WINDOW_KEY[name]: window},
        "per_step": per_step,
        "capacity": draw(st.integers(per_step * (window + 1), 2 * per_step * (window + 1) + 2)),
        "min_chunk": draw(st.integers(1, per_step)),
        "inflight": draw(st.integers(4, 16)),
        "engines": 1,
        "seed": draw(st.integers(0, 10_000)),
        "sigma": draw(st.sampled_from([0.5, 1.5])),
        "failure_rate": 0.0,
        "step_time": draw(st.sampled_from([0.1, 1.0, 5.0])),
        "chunk_time": 0.0,
        "on_dropped_prompt": "replace",
        "filter_rate": draw(st.sampled_from([0.5, 0.7, 0.9])),
        "batch_multiplier": draw(st.sampled_from([1.5, 2.0])),
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(setups())
def test_validated_setups_never_deadlock(setup) -> None:
    check_setup(setup)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(over_sampled_setups())
def test_validated_over_sampled_setups_never_deadlock(setup) -> None:
    check_setup(setup)


def check_setup(setup: dict) -> None:
    """Refused by one of the documented capacity rules, or runs to the end."""
    rng = random.Random(setup["seed"])

    def latency(_req) -> float:
        return rng.lognormvariate(0.0, setup["sigma"]) if setup["sigma"] else 1.0

    def fail(_req) -> bool:
        return rng.random() < setup["failure_rate"]

    engines = [FakeEngine(latency, fail=fail) for _ in range(setup["engines"])]
    steps = 12
    rate = setup["filter_rate"]
    dynamic = {"batch_multiplier": setup["batch_multiplier"],
               **({"filter": "zero_variance", "max_gen_batches": 200} if rate else {})}
    trainer = FakeTrainer(step_time=setup["step_time"], chunk_time=setup["chunk_time"])
    try:
        ctl = make_controller(
            setup["sampler"], engines=engines, trainer=trainer, task=FlatTask(rate),
            dynamic_sampling=dynamic, steps=steps, per_step=setup["per_step"], capacity=setup["capacity"],
            min_chunk=setup["min_chunk"], inflight=setup["inflight"],
            # Two infra attempts: some groups are dropped, and either replaced or
            # their step shrinks (down to a single group).
            rollout_failure={**FORGIVING, "max_infra_attempts_per_prompt": 2,
                             "on_dropped_prompt": setup["on_dropped_prompt"],
                             "min_step_batch_fraction": 0.01},
        )
    except SetupError as exc:
        # Refused: the reason must be one of the two documented capacity rules.
        required = None
        from asyncrl.buffer import RolloutBuffer
        from asyncrl.sampling import create_sampler

        sampler = create_sampler(RolloutBuffer(1), setup["sampler"])
        sampler.set_batch_multiplier(setup["batch_multiplier"])  # whole over-sampled batches
        required = sampler.required_buffer_capacity(setup["per_step"])
        assert (required is not None and setup["capacity"] < required) or (
            setup["capacity"] < setup["min_chunk"]), str(exc)
        return
    try:
        result = run_virtual(ctl.run())
    except TooManyFailedGroups as exc:
        # Shrinking a step of one group would leave it empty: a clean stop naming
        # the floor, never a deadlock.
        assert "below the floor of 1" in str(exc), str(exc)
        assert ctl.stopped_at_safe_point and ctl.summary()["ledger"]["balanced"]
        return
    assert result.steps == steps
    assert result.summary["ledger"]["balanced"]
    shrunk = sum(setup["per_step"] - r["groups_trained"] for r in ctl.step_records)
    assert result.summary["ledger"]["trained"] == steps * setup["per_step"] - shrunk
    assert shrunk == 0 or setup["on_dropped_prompt"] == "shrink"
    if rate:  # only groups with signal were trained
        assert all(max(r.rewards) > min(r.rewards) for _, rs in trainer.chunks for r in rs)
