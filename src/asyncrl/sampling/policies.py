"""The four built-in staleness policies (docs/design.md, one class per row of the policy table).

``s`` is the policy's window; ``v`` the trainer version; ``d`` the dispatch index.

``weight_fifo`` and ``windowed`` measure a group's age by ``staleness_of``:
``start_weight`` (the version it was dispatched at; NeMo-RL's semantics) or
``end_weight`` (the version of its newest tokens). With ``end_weight`` a group
still generating is never aborted for staleness - it generates with the current
weights - and the age of its older tokens is bounded by
``loss.max_token_staleness`` instead.
"""

from __future__ import annotations

from typing import Literal

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.sampling.base import BaseSampler

StalenessOf = Literal["start_weight", "end_weight"]


def _window(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return value


def _measure(value: str) -> StalenessOf:
    if value not in ("start_weight", "end_weight"):
        raise ValueError(f"staleness_of must be 'start_weight' or 'end_weight', got {value!r}")
    return value  # type: ignore[return-value]


class _MeasuredWindow(BaseSampler):
    """A window ``[max(0, v - s), v]`` on the weight ``staleness_of`` names."""

    staleness_of: StalenessOf = "start_weight"

    @property
    def staleness_measure(self) -> str:
        return self.staleness_of

    def _ready_in(self, lo: int | None, hi: int | None, *, limit: int | None = None,
                  freshest_first: bool = False) -> list[Slot]:
        return self.buffer.ready_in_weight_range(lo, hi, limit=limit,
                                                 freshest_first=freshest_first,
                                                 by=self.staleness_of)

    async def evict(self, *, current_train_weight: int) -> int:
        floor = self._floor(current_train_weight)
        return self._evict_slots(self._ready_in(None, floor - 1))

    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        if self.staleness_of == "end_weight":
            return False  # it generates with the current weights: its newest tokens are fresh
        return start_weight_version < self._floor(current_train_weight)

    def max_staleness(self) -> int | None:
        return None if self.staleness_of == "end_weight" else self.declared_window()

    def max_end_staleness(self) -> int | None:
        return self.declared_window()


class InOrderSampler(BaseSampler):
    """Batch ``d`` is stamped ``target_step = d`` and trained exactly at step ``d``.

    Generation may run ``s`` steps ahead; ``s = 0`` is synchronous on-policy GRPO.
    """

    gated = True
    stamps = True
    surplus = "evicted at the next step (its stamp has gone by), counted as evicted"

    def __init__(self, buffer: RolloutBuffer, max_lookahead_versions: int = 1) -> None:
        super().__init__(buffer)
        self.window = _window("max_lookahead_versions", max_lookahead_versions)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        if self._too_few_ready(min_prompt_groups):
            return None
        eligible = self.buffer.ready_by_target(current_train_weight, limit=max_prompt_groups)
        return self._take(eligible, min_prompt_groups)

    async def evict(self, *, current_train_weight: int) -> int:
        return self._evict_slots(self.buffer.ready_target_below(current_train_weight))


class WeightFifoSampler(_MeasuredWindow):
    """Strict oldest-weight-first: train only the oldest in-window weight version.

    If the oldest version in the window still has groups in flight, the trainer
    takes only its ready ones (or waits), so training consumes weight versions
    in order. With ``staleness_of: end_weight`` the versions are the groups'
    newest tokens': a group in flight generates with the current weights, so it
    holds back no older version.
    """

    gated = True

    surplus = "kept; trained by later steps, oldest weight version first, while in the window"

    def __init__(self, buffer: RolloutBuffer, max_staleness_versions: int = 1,
                 staleness_of: StalenessOf = "start_weight") -> None:
        super().__init__(buffer)
        self.window = _window("max_staleness_versions", max_staleness_versions)
        self.staleness_of = _measure(staleness_of)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        if self._too_few_ready(min_prompt_groups):
            return None
        lo, hi = self._floor(current_train_weight), current_train_weight
        if self.staleness_of == "end_weight":
            oldest = self.buffer.min_ready_end_weight(lo, hi)
        else:
            oldest = self.buffer.min_start_weight(lo, hi)
        if oldest is None:
            return None
        eligible = self._ready_in(oldest, oldest, limit=max_prompt_groups)
        return self._take(eligible, min_prompt_groups)


class WindowedSampler(_MeasuredWindow):
    """Any ready group whose weights are at most ``s`` versions old.

    Admission never waits (the buffer capacity bounds run-ahead); groups that
    fall out of the window are evicted, in-flight ones aborted (with
    ``staleness_of: start_weight``).
    """

    surplus = "kept within the window for the next step; evicted once out of it"

    def __init__(
        self,
        buffer: RolloutBuffer,
        max_staleness_versions: int = 1,
        sample_freshest_first: bool = False,
        staleness_of: StalenessOf = "start_weight",
    ) -> None:
        super().__init__(buffer)
        self.window = _window("max_staleness_versions", max_staleness_versions)
        self.sample_freshest_first = bool(sample_freshest_first)
        self.staleness_of = _measure(staleness_of)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        if self._too_few_ready(min_prompt_groups):
            return None
        eligible = self._ready_in(
            self._floor(current_train_weight),
            current_train_weight,
            limit=max_prompt_groups,
            freshest_first=self.sample_freshest_first,
        )
        return self._take(eligible, min_prompt_groups)

    def required_capacity_for(self, window: int, groups_per_step: int) -> int | None:
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
    surplus = "kept; trained by later steps in dispatch order (never evicted)"

    def __init__(self, buffer: RolloutBuffer, max_staleness_versions: int = 1) -> None:
        super().__init__(buffer)
        self.window = _window("max_staleness_versions", max_staleness_versions)

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        if self._too_few_ready(min_prompt_groups):
            return None
        eligible = self.buffer.ready_in_weight_range(
            None, current_train_weight, limit=max_prompt_groups
        )
        return self._take(eligible, min_prompt_groups)

    def max_staleness(self) -> int | None:
        return 0 if self.declared_window() == 0 else None
