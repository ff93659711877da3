"""The sampler protocol and the short base class every built-in policy extends."""

from __future__ import annotations

import asyncio
from typing import Any, Protocol, runtime_checkable

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.version import TrainerVersion


@runtime_checkable
class PromptGroupSampler(Protocol):
    """The whole staleness contract of a run, in one object.

    Construction: ``Sampler(buffer, **kwargs)`` with the shared
    :class:`~asyncrl.buffer.RolloutBuffer` first (a Protocol cannot express
    ``__init__``; :func:`asyncrl.sampling.create_sampler` checks it).
    """

    async def admit(self, *, trainer_version: TrainerVersion) -> int | None:
        """Called by the rollout pump once per dispatch batch, before any of its
        groups is reserved. Waits until the batch may go; returns its
        ``target_step`` stamp (or None). Must wait on ``trainer_version``, never poll."""
        ...

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        """Called by the train pump after :meth:`evict`, each time it wants a chunk.
        Returns ready slots (already removed from the buffer) or None when fewer than
        ``min_prompt_groups`` are eligible. Never waits."""
        ...

    async def evict(self, *, current_train_weight: int) -> int:
        """Called by the train pump before every :meth:`select`. Removes ready slots
        that can never be selected again and returns how many; never touches
        unready slots."""
        ...

    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        """Called by the controller after each weight sync, once per in-flight group:
        True if a group started at that weight version can never be trained."""
        ...

    @property
    def is_on_policy(self) -> bool:
        """Read at setup and after each weight sync: True when the policy admits no
        staleness (then engine caches are invalidated on every update)."""
        ...

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        """Read at setup: the buffer capacity below which the policy could deadlock,
        or None when any capacity works."""
        ...

    def set_dispatch_index(self, resume_from_step: int) -> None:
        """Called on resume, after :meth:`load_state_dict` and before the first
        admit, with the number of batches admitted before the checkpoint: the
        next batch gets ``d = resume_from_step`` and gates and stamps as in a
        fresh run (a sampler whose state does not hold the index still resumes
        exactly)."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Called when a checkpoint is written."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called on resume, before the pumps start."""
        ...


class BaseSampler:
    """Dispatch counter, admission gate, greedy take and persistence for policies.

    Subclasses implement :meth:`select`, and override :meth:`admit`,
    :meth:`evict`, :meth:`should_abort_inflight` and the derived facts where
    their semantics differ from the defaults here.
    """

    #: The policy's staleness/lookahead knob ``s``; 0 means on-policy.
    window: int = 0
    #: Admission waits at the gate ``d <= v + window`` (False: never waits).
    gated: bool = False
    #: ``admit`` returns the batch's index as its ``target_step`` stamp.
    stamps: bool = False

    def __init__(self, buffer: RolloutBuffer) -> None:
        if not isinstance(buffer, RolloutBuffer) and not hasattr(buffer, "remove"):
            raise TypeError(
                f"{type(self).__name__} takes the RolloutBuffer as its first argument, "
                f"got {type(buffer).__name__}"
            )
        self.buffer = buffer
        self._dispatch_index = 0
        self._admit_lock = asyncio.Lock()

    # ---------------------------------------------------------------- admit
    @property
    def dispatch_index(self) -> int:
        """Index ``d`` the next admitted batch will get."""
        return self._dispatch_index

    async def admit(self, *, trainer_version: TrainerVersion) -> int | None:
        """Count the batch; wait at the gate when ``gated``; stamp when ``stamps``."""
        if not self.gated:
            self._dispatch_index += 1
            return None
        d = await self._admit_gated(trainer_version)
        return d if self.stamps else None

    async def _admit_gated(self, trainer_version: TrainerVersion) -> int:
        """Admit batch ``d`` once ``d <= v + window``; return ``d``.

        Equivalent to the table's "gate for batch d+1: wait until d < v + s"
        (there ``d`` is the previous batch). The lock keeps indexes unique even
        if a caller admits concurrently.
        """
        async with self._admit_lock:
            d = self._dispatch_index
            window = self.window
            await trainer_version.wait_until(lambda v: d <= v + window)
            self._dispatch_index = d + 1
            return d

    def set_dispatch_index(self, resume_from_step: int) -> None:
        """The next admitted batch gets ``d = resume_from_step``."""
        if resume_from_step < 0:
            raise ValueError(f"dispatch index must be >= 0, got {resume_from_step}")
        self._dispatch_index = resume_from_step

    # ------------------------------------------------------- select / evict
    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        raise NotImplementedError

    async def evict(self, *, current_train_weight: int) -> int:
        return 0

    def _take(self, eligible: list[Slot], min_prompt_groups: int) -> list[Slot] | None:
        """Greedy: all of ``eligible`` (already capped at max) or None if too few."""
        if len(eligible) < min_prompt_groups:
            return None
        return self.buffer.remove([s.group_id for s in eligible])

    def _evict_slots(self, slots: list[Slot]) -> int:
        return len(self.buffer.remove([s.group_id for s in slots]))

    @staticmethod
    def _check_bounds(min_prompt_groups: int, max_prompt_groups: int) -> None:
        if not 1 <= min_prompt_groups <= max_prompt_groups:
            raise ValueError(
                "select needs 1 <= min_prompt_groups <= max_prompt_groups, got "
                f"min={min_prompt_groups}, max={max_prompt_groups}"
            )

    def _floor(self, current_train_weight: int) -> int:
        """Oldest start_weight inside the window at trainer version ``v``."""
        return max(0, current_train_weight - self.window)

    # -------------------------------------------------------- derived facts
    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        return False

    @property
    def is_on_policy(self) -> bool:
        return self.window == 0

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        return groups_per_step * (self.window + 1)

    def max_staleness(self) -> int | None:
        """Largest staleness (``v - start_weight``) a trained group can have, or
        None if unbounded."""
        return self.window

    @property
    def staleness_measure(self) -> str:
        """Which weight of a group the policy's window bounds: ``start_weight``
        (the version it was dispatched at) or ``end_weight`` (the version of its
        newest tokens; older tokens are then bounded by ``loss.max_token_staleness``)."""
        return "start_weight"

    def max_end_staleness(self) -> int | None:
        """Largest ``v - end_weight`` of a trained group: how old its newest tokens
        can be (None: unbounded). Never above :meth:`max_staleness`."""
        return self.max_staleness()

    def pinned_weight_version(self, dispatch_index: int) -> int | None:
        """Deterministic mode: the weight version batch ``dispatch_index`` is
        generated with, or None when timing decides it (deterministic mode is
        then refused).

        A gated policy admits batch ``d`` once ``v >= d - window``, so version
        ``max(0, d - window)`` exists when the batch goes, whatever the timing.
        An ungated one admits ahead of any version: it cannot pin.
        """
        if not self.gated:
            return None
        return max(0, dispatch_index - self.window)

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        return {"policy": type(self).__name__, "dispatch_index": self._dispatch_index}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            index = int(state["dispatch_index"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict needs a dict with an integer "
                f"'dispatch_index' (from state_dict()), got {state!r}"
            ) from None
        self.set_dispatch_index(index)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(window={self.window}, dispatch_index={self._dispatch_index})"
