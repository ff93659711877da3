"""``staleness_of: end_weight`` on weight_fifo and windowed: the contract checks
and the reference state machine of the start_weight variants, run on the
end_weight ones, and the case it exists for - a straggler whose newest tokens
are fresh is trained, not thrown away."""

from __future__ import annotations

import pytest
from hypothesis.stateful import run_state_machine_as_test

from asyncrl.buffer import RolloutBuffer
from asyncrl.sampling import WeightFifoSampler, WindowedSampler

from . import test_contract as contract
from .helpers import END_WEIGHT_VARIANTS, make_twins, variant_id
from .test_stateful import SETTINGS, _SamplerMachine

variants = pytest.mark.parametrize("variant", END_WEIGHT_VARIANTS,
                                   ids=[variant_id(v) for v in END_WEIGHT_VARIANTS])


@variants
@pytest.mark.parametrize("seed", range(2))
async def test_select_and_evict_keep_the_contract(variant: tuple, seed: int) -> None:
    contract.test_satisfies_the_protocol(variant)
    await contract.test_select_and_evict_only_touch_ready_slots_and_never_repeat(variant, seed)
    await contract.test_select_is_greedy_and_returns_none_below_min(variant)
    contract.test_derived_facts_agree_with_the_reference(variant)


@variants
def test_policy_matches_reference(variant: tuple) -> None:
    machine = type(f"Machine_{variant_id(variant)}", (_SamplerMachine,), {"variant": variant})
    run_state_machine_as_test(machine, settings=SETTINGS)


@pytest.mark.parametrize("cls", [WeightFifoSampler, WindowedSampler])
async def test_a_straggler_with_fresh_tokens_is_trained_not_discarded(cls: type) -> None:
    """At v = 5 with s = 1 a group dispatched at version 1 that finished at 5 is
    out of the window by its start and in it by its newest tokens."""
    facts = {}
    for measure in ("start_weight", "end_weight"):
        buf = RolloutBuffer(8)
        sampler = cls(buf, max_staleness_versions=1, staleness_of=measure)
        buf.reserve_nowait("straggler", start_weight=1)
        buf.commit("straggler", None, end_weight=5)
        buf.reserve_nowait("old", start_weight=2)
        buf.commit("old", None, end_weight=3)
        buf.reserve_nowait("running", start_weight=1)  # still generating
        evicted = await sampler.evict(current_train_weight=5)
        chosen = await sampler.select(current_train_weight=5, min_prompt_groups=1,
                                      max_prompt_groups=4) or []
        aborts = sampler.should_abort_inflight(start_weight_version=1, current_train_weight=5)
        facts[measure] = (evicted, [s.group_id for s in chosen], aborts,
                          sampler.max_staleness(), sampler.max_end_staleness(),
                          sampler.staleness_measure)
    assert facts["start_weight"] == (2, [], True, 1, 1, "start_weight")
    assert facts["end_weight"] == (1, ["straggler"], False, None, 1, "end_weight")


def test_staleness_of_is_checked() -> None:
    with pytest.raises(ValueError, match="staleness_of must be"):
        WindowedSampler(RolloutBuffer(4), staleness_of="newest")
    _, sampler, _ = make_twins(("windowed", 1, False, "end_weight"), capacity=4)
    assert sampler.staleness_measure == "end_weight"
