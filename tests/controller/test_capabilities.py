"""Engines' optional members are read once, when the controller gets the engines,
and the controller takes its roles as instances (docs/controller.md)."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.buffer import RolloutBuffer
from asyncrl.engines import EngineCapabilities
from asyncrl.errors import UsageError
from asyncrl.sampling import create_sampler
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeSource, FakeTrainer, lognormal_latency

WINDOW_0 = {"name": "windowed", "max_staleness_versions": 0}


class BareEngine:
    """Only the protocol (no abort, no cache invalidation), over a FakeEngine."""

    def __init__(self, inner: FakeEngine) -> None:
        self.inner = inner

    async def generate(self, request: Any) -> Any:
        return await self.inner.generate(request)

    async def update_weights(self, weights: Any, version: int) -> None:
        await self.inner.update_weights(weights, version)

    async def close(self) -> None:
        await self.inner.close()


def test_capabilities_are_read_from_the_engine_class() -> None:
    assert EngineCapabilities.of(FakeEngine()).names() == ["abort", "invalidate_cache"]
    from asyncrl.engines.local.engine import LocalEngine

    local = EngineCapabilities.of(LocalEngine)
    assert local.snapshot and local.pinned_versions and local.device and not local.healthy


@pytest.mark.parametrize("bare", [False, True])
def test_an_engine_without_abort_still_runs_a_run_that_aborts(bare: bool) -> None:
    # Long tails at window 0: groups fall out of the window and are aborted.
    fake = FakeEngine(lognormal_latency(7, median=1.0, sigma=1.5))
    engine = BareEngine(fake) if bare else fake
    ctl = make_controller(WINDOW_0, engines=[engine], trainer=FakeTrainer(step_time=0.5),
                          steps=20, capacity=10, inflight=10)
    assert ctl.capabilities[0].abort is not bare
    assert ctl.capabilities[0].invalidate_cache is not bare
    result = run_virtual(ctl.run())
    ledger = result.summary["ledger"]
    assert ledger["balanced"] and ledger["aborted"] > 0, ledger
    # The bare engine was never told (it cannot be): its groups were cancelled.
    assert (fake.aborted == []) is bare
    assert (fake.invalidations == 0) is bare  # on-policy: the others' caches are dropped


def test_the_controller_takes_its_sampler_buffer_and_prompts() -> None:
    buffer = RolloutBuffer(12)
    sampler = create_sampler(buffer, {"name": "in_order", "max_lookahead_versions": 1})
    prompts = FakeSource(limit=None)
    ctl = make_controller({"name": "in_order", "max_lookahead_versions": 2}, steps=3,
                          buffer=buffer, sampler_instance=sampler, prompts=prompts)
    assert ctl.sampler is sampler and ctl.buffer is buffer
    result = run_virtual(ctl.run())
    assert result.steps == 3 and prompts.position >= 12  # its prompts were the ones used
    with pytest.raises(UsageError, match=r"pass buffer=\.\.\. too"):
        make_controller({"name": "in_order", "max_lookahead_versions": 1},
                        sampler_instance=sampler)
