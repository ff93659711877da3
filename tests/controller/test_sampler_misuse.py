"""What the train pump does with a custom sampler that breaks select's contract
(or bends it): a chunk too large or not ready stops the run naming the sampler;
slots removed but not returned are counted evicted, so none goes missing."""

from __future__ import annotations

import pytest

from asyncrl.errors import ControllerBug
from asyncrl.sampling import BaseSampler
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller


class TakesOneDropsTheRest(BaseSampler):
    """Returns the oldest ready group and removes every other ready one: the
    dropped ones were never returned, so the pump must count them evicted."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None)
        if not ready:
            return None
        self.buffer.remove([s.group_id for s in ready[1:]])
        return self.buffer.remove([ready[0].group_id])


class DropsOneAndReturnsNothing(BaseSampler):
    """Every other ask removes the oldest ready group and returns None."""

    window = 0
    asks = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=max_prompt_groups)
        self.asks += 1
        if self.asks % 2 and ready:
            self.buffer.remove([ready[0].group_id])
            return None
        return self._take(ready, min_prompt_groups)


class TooMany(BaseSampler):
    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None)
        if len(ready) <= max_prompt_groups:
            return None
        return self.buffer.remove([s.group_id for s in ready])


class Unready(BaseSampler):
    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        reserved = [s for s in self.buffer.slots() if not s.ready]
        return reserved[:1] or None


def _custom(cls: type) -> dict[str, str]:
    return {"name": "custom", "target": f"{__name__}:{cls.__name__}"}


@pytest.mark.parametrize("cls", [TakesOneDropsTheRest, DropsOneAndReturnsNothing])
def test_groups_a_sampler_removes_without_returning_are_counted_evicted(cls: type) -> None:
    ctl = make_controller(_custom(cls), steps=6, per_step=3, capacity=12,
                          min_chunk=1, inflight=6)
    result = run_virtual(ctl.run())
    ledger = result.summary["ledger"]
    assert result.steps == 6 and ledger["balanced"], ledger
    assert ledger["evicted"] > 0
    assert ledger["dispatched"] == sum(ledger[k] for k in
                                       ("trained", "evicted", "aborted", "failed", "pending"))


@pytest.mark.parametrize(("cls", "says"), [
    (TooMany, r"TooMany\.select returned \d+ groups, more than max_prompt_groups=\d+"),
    (Unready, r"sampler Unready selected unready group"),
])
def test_a_chunk_that_breaks_selects_contract_stops_the_run_naming_the_sampler(
        cls: type, says: str) -> None:
    ctl = make_controller(_custom(cls), steps=4, per_step=3, capacity=12, min_chunk=1,
                          inflight=6)
    with pytest.raises(ControllerBug, match=says):
        run_virtual(ctl.run())
