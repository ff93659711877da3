"""What the train pump does with a custom sampler that breaks select's or evict's
contract (or bends it): a chunk too large or too small, not ready, not Slots or
holding a slot select did not remove (or one twice), and a select or evict that
removes a group still generating, stop the run at a safe point naming the
sampler, with the ledger balanced;
slots removed but not returned are counted evicted, so none goes missing; a
sampler that raises stops the run at a safe point, resumable once it is fixed."""

from __future__ import annotations

import json
import re

import pytest

from asyncrl.buffer import RolloutBuffer
from asyncrl.errors import BackendBug, ControllerBug
from asyncrl.sampling import BaseSampler, InOrderSampler
from asyncrl.sim.clock import run_virtual
from tests.controller.conftest import make_controller
from tests.fakes import FakeEngine, FakeTrainer, lognormal_latency


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


class ReturnsWithoutRemoving(BaseSampler):
    """Returns ready slots it left in the buffer (forgot ``buffer.remove``)."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=max_prompt_groups)
        return ready if len(ready) >= min_prompt_groups else None


class RemovesOneReturnsTwo(BaseSampler):
    """Removes the oldest ready slot but returns the next one as well."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=2)
        if len(ready) < 2:
            return None
        return [*self.buffer.remove([ready[0].group_id]), ready[1]]


class ReturnsOneTwice(BaseSampler):
    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=1)
        if not ready or max_prompt_groups < 2:
            return None
        return self.buffer.remove([ready[0].group_id]) * 2


class ReturnsIds(BaseSampler):
    """Returns the group ids of the slots it took instead of the slots."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=max_prompt_groups)
        taken = self._take(ready, min_prompt_groups)
        return None if taken is None else [s.group_id for s in taken]


class TooFew(BaseSampler):
    """Takes one ready group whatever min_prompt_groups asks."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        return self._take(self.buffer.ready_in_weight_range(None, None, limit=1), 1)


class EmptyList(BaseSampler):
    """Returns [] instead of None when too few groups are eligible."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=max_prompt_groups)
        return self._take(ready, min_prompt_groups) or []


class EvictsGenerating(BaseSampler):
    """Selects like ready_first, but evicts every slot still generating."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        ready = self.buffer.ready_in_weight_range(None, None, limit=max_prompt_groups)
        return self._take(ready, min_prompt_groups)

    async def evict(self, *, current_train_weight):
        return self._evict_slots([s for s in self.buffer.slots() if not s.ready])


class SelectsGenerating(BaseSampler):
    """Removes a slot still generating (and returns it) when a group is ready."""

    window = 0

    async def select(self, *, current_train_weight, min_prompt_groups, max_prompt_groups):
        generating = [s for s in self.buffer.slots() if not s.ready]
        if not generating or not self.buffer.ready_count:
            return None
        return self.buffer.remove([generating[0].group_id])


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


CONTRACT = (r"\. It is a bug in that sampler: fix it, then resume the run from its checkpoint$")


@pytest.mark.parametrize(("cls", "says"), [
    (TooMany, r"TooMany\.select returned \d+ groups, more than max_prompt_groups=\d+"),
    (Unready, r"sampler \S+\.Unready\.select returned group \S+, which is not ready \(still "
              r"generating\): select returns ready slots only"),
    (ReturnsWithoutRemoving, r"sampler \S+\.ReturnsWithoutRemoving\.select returned group \S+, "
                             r"which it did not remove from the buffer: select must return the "
                             r"slots it removed from the buffer \(buffer\.remove returns them\)"),
    (RemovesOneReturnsTwo, r"sampler \S+\.RemovesOneReturnsTwo\.select returned group \S+, which "
                           r"it did not remove from the buffer"),
    (ReturnsOneTwice, r"sampler \S+\.ReturnsOneTwice\.select returned a group twice"),
    (ReturnsIds, r"sampler \S+\.ReturnsIds\.select returned a list holding int \d+; select "
                 r"returns a list of the Slot objects it removed from the buffer "
                 r"\(buffer\.remove returns them\), or None"),
    (TooFew, r"sampler \S+\.TooFew\.select returned 1 group, fewer than min_prompt_groups=2: "
             r"select returns None when fewer than min_prompt_groups are eligible"),
    (EmptyList, r"sampler \S+\.EmptyList\.select returned 0 groups, fewer than "
                r"min_prompt_groups=2"),
    (EvictsGenerating, r"sampler \S+\.EvictsGenerating\.evict asked the buffer to remove group "
                       r"\S+, which is still generating \(that call removed nothing; what "
                       r"the sampler removed before it is counted evicted\): select and evict "
                       r"remove ready slots only"),
    (SelectsGenerating, r"sampler \S+\.SelectsGenerating\.select asked the buffer to remove "
                        r"group \S+, which is still generating"),
])
def test_a_sampler_that_breaks_its_contract_stops_at_a_safe_point_naming_it(
        cls: type, says: str) -> None:
    """Found before the buffer or the ledger could be corrupted: the run stops
    where it can be checkpointed, and whatever the breaking call removed is
    counted evicted, so the ledger balances (and a resume finds every group)."""
    ctl = make_controller(_custom(cls), steps=4, per_step=3, capacity=12, min_chunk=2,
                          inflight=6, engines=[FakeEngine(lognormal_latency(5))])
    with pytest.raises(ControllerBug, match=says) as err:
        run_virtual(ctl.run())
    assert re.search(CONTRACT, str(err.value)), err.value
    assert ctl.stopped_at_safe_point and ctl.version.value < 4
    ledger = ctl.summary()["ledger"]
    assert ledger["balanced"], ledger
    assert json.loads(json.dumps(ctl.state_dict()))  # a checkpoint can be written


class Breaks(InOrderSampler):
    """in_order, except that ``method`` raises from step 3 on; ``removing``: select
    removes a ready group before it raises (then counted evicted)."""

    def __init__(self, buffer: RolloutBuffer, method: str | None, removing: bool = False) -> None:
        super().__init__(buffer, max_lookahead_versions=1)
        self.method, self.removing = method, removing

    async def admit(self, *, trainer_version):
        if self.method == "admit" and trainer_version.value >= 3:
            raise KeyError("admit broke")
        return await super().admit(trainer_version=trainer_version)

    async def select(self, *, current_train_weight, **bounds):
        if self.method == "select" and current_train_weight >= 3:
            ready = self.buffer.ready_in_weight_range(None, None)
            if ready and self.removing:
                self.buffer.remove([ready[0].group_id])
            raise ValueError("select broke")
        return await super().select(current_train_weight=current_train_weight, **bounds)

    async def evict(self, *, current_train_weight):
        if self.method == "evict" and current_train_weight >= 3:
            raise RuntimeError("evict broke")
        return await super().evict(current_train_weight=current_train_weight)


KW = {"steps": 8, "per_step": 3, "capacity": 9, "min_chunk": 1, "inflight": 6}


def _breaking(method: str | None, removing: bool = False, **extra):
    buffer = RolloutBuffer(KW["capacity"])
    return make_controller({"name": "in_order", "max_lookahead_versions": 1}, **KW, **extra,
                           buffer=buffer, sampler_instance=Breaks(buffer, method, removing))


@pytest.mark.parametrize("method", ["admit", "select", "evict"])
def test_a_sampler_that_raises_stops_at_a_safe_point_and_resumes_once_fixed(method) -> None:
    run = _breaking

    first = run(method, engines=[FakeEngine(lognormal_latency(5))])
    with pytest.raises(BackendBug, match=rf"sampler {__name__}\.Breaks raised \w+ in {method}: "
                                         r".*Fix it, then resume") as err:
        run_virtual(first.run())
    assert f"{method} broke" in str(err.value.__cause__)
    assert first.stopped_at_safe_point and 3 <= first.version.value < 8
    summary = first.summary()
    assert summary["ledger"]["balanced"], summary["ledger"]

    state = json.loads(json.dumps(first.state_dict()))
    trainer = FakeTrainer()
    trainer.load_state_dict(first.trainer.state_dict())
    engine = FakeEngine(lognormal_latency(6))
    engine.weight_version = state["trainer_version"]
    second = run(None, engines=[engine], trainer=trainer, history=first.ledger.history)
    second.load_state_dict(state)
    result = run_virtual(second.run())
    assert result.steps == 8 and result.summary["ledger"]["balanced"]


def test_what_a_raising_select_removed_is_counted_evicted() -> None:
    ctl = _breaking("select", removing=True, engines=[FakeEngine(lognormal_latency(5))])
    with pytest.raises(BackendBug, match="raised ValueError in select"):
        run_virtual(ctl.run())
    ledger = ctl.summary()["ledger"]
    assert ctl.stopped_at_safe_point and ledger["balanced"] and ledger["evicted"] == 1, ledger

