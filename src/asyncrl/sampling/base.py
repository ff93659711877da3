"""The sampler protocol and the short base class every built-in policy extends."""

from __future__ import annotations

import asyncio
import math
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


@runtime_checkable
class RetunableSampler(Protocol):
    """A sampler whose window may change while the run goes on (the autopilot's
    ``window`` knob, :mod:`asyncrl.controller.retune`). The built-ins all are.

    Transition rule (docs/autopilot.md): a new window gates admission from the
    moment it is set. A *larger* window also bounds eviction and aborts at once.
    A *smaller* one does so only once the groups started under the old one are
    gone: until a step boundary finds the trainer version past ``v0 + s_old``
    (``v0`` the version when it was set) **and** no slot started at a version
    ``<= v0`` left in the buffer, eviction, aborts and the derived facts keep ``s_old``, so a
    shrink never evicts or aborts a group that was legal when it started. A
    shrink before the first admission (no group started yet) holds nothing.
    """

    #: The window admission uses now (the last one set).
    window: int

    def set_window(self, window: int, *, version: int) -> None:
        """Called by the controller at a step boundary (trainer version ``version``)."""
        ...

    def step_boundary(self, version: int) -> None:
        """Called by the controller at every step boundary (after the weight sync
        to ``version``): a held window that expired is dropped here, so the
        window in force never changes in the middle of a step."""
        ...

    def window_in_force(self, version: int) -> int:
        """The window eviction, aborts and the derived facts use at ``version``."""
        ...

    def required_capacity_for(self, window: int, groups_per_step: int) -> int | None:
        """:meth:`PromptGroupSampler.required_buffer_capacity` with ``window`` as the window."""
        ...


@runtime_checkable
class OverSamplingSampler(Protocol):
    """A sampler that owns over-sampling (``grpo.dynamic_sampling.batch_multiplier``,
    NeMo-RL's ``batch_multiplier``); the built-ins all are.

    With a multiplier ``m``, every admitted dispatch batch holds
    ``groups_per_batch(n) = ceil(m * n)`` groups instead of ``n``: the extra
    groups cover the ones the filter rejects without a replacement's whole
    generation latency. The sampler accounts for the larger batches in
    :meth:`PromptGroupSampler.required_buffer_capacity` (and so in the deadlock
    checks and re-tuning) and decides what becomes of kept groups beyond a
    step's need (the built-ins: docs/design.md, "Over-sampling").
    """

    #: What becomes of kept groups beyond a step's need, in words (``asyncrl
    #: validate`` prints it).
    surplus: str

    def set_batch_multiplier(self, multiplier: float) -> None:
        """Called once at setup (``validate_setup``), before the derived facts
        are read and before the first admit."""
        ...

    def groups_per_batch(self, groups_per_step: int) -> int:
        """Read by the rollout pump at every admit: the prompts the batch gets."""
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
    #: Groups per dispatch batch, as a multiple of ``num_prompts_per_step``
    #: (:class:`OverSamplingSampler`); 1.0: no over-sampling.
    batch_multiplier: float = 1.0
    #: See :class:`OverSamplingSampler`.
    surplus: str = "kept in the buffer for later steps"

    def __init__(self, buffer: RolloutBuffer) -> None:
        if not isinstance(buffer, RolloutBuffer) and not hasattr(buffer, "remove"):
            raise TypeError(
                f"{type(self).__name__} takes the RolloutBuffer as its first argument, "
                f"got {type(buffer).__name__}"
            )
        self.buffer = buffer
        self._dispatch_index = 0
        self._admit_lock = asyncio.Lock()
        #: After a shrink: (old window, version it was set at), until it expires.
        self._held: tuple[int, int] | None = None
        #: The TrainerVersion admit waits on (woken when the window grows).
        self._gate_version: TrainerVersion | None = None
        #: A re-tune moved the window: the state then keeps it (and the hold).
        self._retuned = False

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
            self._gate_version = trainer_version
            # The live window, read at every wake-up: a re-tune moves the gate.
            await trainer_version.wait_until(lambda v: d <= v + self.window)
            self._dispatch_index = d + 1
            return d

    # ---------------------------------------------------------- over-sampling
    def set_batch_multiplier(self, multiplier: float) -> None:
        """See :class:`OverSamplingSampler`."""
        if isinstance(multiplier, bool) or not isinstance(multiplier, (int, float)) or not (
                1.0 <= multiplier < math.inf):
            raise ValueError(f"{type(self).__name__}: batch_multiplier must be a number >= 1, "
                             f"got {multiplier!r}")
        self.batch_multiplier = float(multiplier)

    def groups_per_batch(self, groups_per_step: int) -> int:
        # round() first: 1.1 * 10 is 11.000000000000002 in floats, not 12 groups.
        return max(groups_per_step, math.ceil(round(self.batch_multiplier * groups_per_step, 9)))

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

    def _too_few_ready(self, min_prompt_groups: int) -> bool:
        """Fewer groups are ready in the whole buffer than ``select`` must
        return: it returns None without looking (the train pump asks after
        every commit, and most asks find a chunk still filling)."""
        return self.buffer.ready_count < min_prompt_groups

    def _evict_slots(self, slots: list[Slot]) -> int:
        if not slots:  # most steps' rounds: nothing to evict, no call into the buffer
            return 0
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
        return max(0, current_train_weight - self.window_in_force(current_train_weight))

    # -------------------------------------------------------------- re-tuning
    def set_window(self, window: int, *, version: int) -> None:
        """See :class:`RetunableSampler` for when each use of the window changes."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise ValueError(f"{type(self).__name__}: window must be an integer >= 0, "
                             f"got {window!r}")
        old = self.declared_window()
        # Before the first admission no group started under the old window, so
        # a shrink holds nothing (a run starting from async_rl.autopilot.reuse).
        started = self._dispatch_index > 0 or len(self.buffer) > 0
        if window < old and started:
            # Hold the largest window any live group started under, from the
            # newest shrink on (a second shrink while one is held extends it).
            self._held = (old, version)
        self.window = window
        self._retuned = True
        if window > old and self._gate_version is not None:
            self._gate_version.recheck()  # a waiting admit may pass the wider gate now

    def step_boundary(self, version: int) -> None:
        held = self._held
        if held is None:
            return
        old, since = held
        # Slots started at <= since were legal under `old`; none is left once
        # the version passed since + old and the buffer holds none of them.
        if version > since + old and self.buffer.min_start_weight(0, since) is None:
            self._held = None

    def window_in_force(self, version: int) -> int:
        return self.declared_window()

    def declared_window(self) -> int:
        """The window the derived facts state: the held one during a shrink."""
        return self.window if self._held is None else max(self._held[0], self.window)

    def required_capacity_for(self, window: int, groups_per_step: int) -> int | None:
        # Every batch the gate lets ahead must fit whole: s + 1 batches of
        # groups_per_batch (over-sampled) groups.
        return self.groups_per_batch(groups_per_step) * (window + 1)

    # -------------------------------------------------------- derived facts
    def should_abort_inflight(self, *, start_weight_version: int, current_train_weight: int) -> bool:
        return False

    @property
    def is_on_policy(self) -> bool:
        return self.declared_window() == 0

    def required_buffer_capacity(self, groups_per_step: int) -> int | None:
        return self.required_capacity_for(self.declared_window(), groups_per_step)

    def max_staleness(self) -> int | None:
        """Largest staleness (``v - start_weight``) a trained group can have, or
        None if unbounded."""
        return self.declared_window()

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
        state: dict[str, Any] = {"policy": type(self).__name__,
                                 "dispatch_index": self._dispatch_index}
        if self._retuned:  # a resumed run goes on with the re-tuned window
            state["window"] = self.window
            state["held"] = None if self._held is None else list(self._held)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        try:
            index = int(state["dispatch_index"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{type(self).__name__}.load_state_dict needs a dict with an integer "
                f"'dispatch_index' (from state_dict()), got {state!r}"
            ) from None
        self.set_dispatch_index(index)
        if "window" in state:
            self.window, self._retuned = int(state["window"]), True
            held = state.get("held")
            self._held = None if held is None else (int(held[0]), int(held[1]))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(window={self.window}, dispatch_index={self._dispatch_index})"
