"""The four built-in staleness policies (DESIGN.md §3, one class per row).

``s`` is the policy's window; ``v`` the trainer version; ``d`` the dispatch index.
"""

from __future__ import annotations

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.sampling.base import BaseSampler


def _window(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


class InOrderSampler(BaseSampler):
    """Batch ``d`` is stamped ``target_step = d`` and trained exactly at step ``d``.

    Generation may run ``s`` steps ahead; ``s = 0`` is synchronous on-policy GRPO.
    """

    gated = True
    stamps = True

    def __init__(self, buffer: RolloutBuffer, max_lookahead_versions: int = 1) -> None:
        super().__init__(buffer)
        self.window = _window("max_lookahead_versions", max_lookahead_versions)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        eligible = self.buffer.ready_by_target(current_train_weight, limit=max_prompt_groups)
        return self._take(eligible, min_prompt_groups)

    async def evict(self, *, current_train_weight: int) -> int:
        return self._evict_slots(self.buffer.ready_target_below(current_train_weight))


class WeightFifoSampler(BaseSampler):
    """Strict oldest-weight-first: train only the oldest in-window weight version.

    If the oldest version in the window still has groups in flight, the trainer
    takes only its ready ones (or waits), so training consumes weight versions
    in order.
    """

    gated = True

    def __init__(self, buffer: RolloutBuffer, max_staleness_versions: int = 1) -> None:
        super().__init__(buffer)
        self.window = _window("max_staleness_versions", max_staleness_versions)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        oldest = self.buffer.min_start_weight(self._floor(current_train_weight), current_train_weight)
        if oldest is None:
            return None
        eligible = self.buffer.ready_in_weight_range(oldest, oldest, limit=max_prompt_groups)
        return self._take(eligible, min_prompt_groups)

    async def evict(self, *, current_train_weight: int) -> int:
        floor = self._floor(current_train_weight)
        return self._evict_slots(self.buffer.ready_in_weight_range(None, floor - 1))

    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        return start_weight_version < current_train_weight - self.window


class WindowedSampler(BaseSampler):
    """Any ready group whose weights are at most ``s`` versions old.

    Admission never waits (the buffer capacity bounds run-ahead); groups that
    fall out of the window are evicted, in-flight ones aborted.
    """

    def __init__(
        self,
        buffer: RolloutBuffer,
        max_staleness_versions: int = 1,
        sample_freshest_first: bool = False,
    ) -> None:
        super().__init__(buffer)
        self.window = _window("max_staleness_versions", max_staleness_versions)
        self.sample_freshest_first = bool(sample_freshest_first)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        eligible = self.buffer.ready_in_weight_range(
            self._floor(current_train_weight),
            current_train_weight,
            limit=max_prompt_groups,
            freshest_first=self.sample_freshest_first,
        )
        return self._take(eligible, min_prompt_groups)

    async def evict(self, *, current_train_weight: int) -> int:
        floor = self._floor(current_train_weight)
        return self._evict_slots(self.buffer.ready_in_weight_range(None, floor - 1))

    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        return start_weight_version < current_train_weight - self.window

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        return None


class ReadyFirstSampler(BaseSampler):
    """Whatever finished first, in dispatch order; staleness bounded by admission.

    Nothing is evicted or aborted. The admission gate bounds how many batches
    are outstanding, not how old a trained group is: while one slow group is
    generating, later batches fill the steps, so its staleness has no bound when
    ``s >= 1`` (:meth:`max_staleness` is None). With ``s = 0`` only the current
    step's batch is ever outstanding, so the policy is on-policy.
    """

    gated = True

    def __init__(self, buffer: RolloutBuffer, max_staleness_versions: int = 1) -> None:
        super().__init__(buffer)
        self.window = _window("max_staleness_versions", max_staleness_versions)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        eligible = self.buffer.ready_in_weight_range(
            None, current_train_weight, limit=max_prompt_groups
        )
        return self._take(eligible, min_prompt_groups)

    def max_staleness(self) -> int | None:
        return 0 if self.window == 0 else None
