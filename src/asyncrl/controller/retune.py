"""Re-tuning the staleness contract while the run goes on (issue 38).

Three knobs may change: the in-flight bound (``max_inflight_prompts``), the
sampler's window and the buffer capacity (``max_buffered_rollouts``). A change
is *requested* at any time (:meth:`Retuner.request`, checked at once against
the derived facts of the setting it asks for; one that fails is refused with a
:class:`~asyncrl.errors.RetuneRefused` and never applied) and *applied* at the
next step boundary: after step ``v``'s weight sync, with the trainer version at
``v + 1``, before step ``v + 1`` selects anything.

When each change takes effect (docs/autopilot.md has the table):

* **in-flight bound**: from the next permit on. A shrink aborts nothing; no
  permit is given while ``inflight >= bound``, so ``inflight <= bound`` holds
  from the moment the groups in flight first drop to the bound.
* **window**: gates admission at once. A shrink bounds eviction, aborts and
  the declared facts (``max_staleness``, ``required_buffer_capacity``) only once
  the groups started under the old window are gone (``RetunableSampler``).
* **capacity**: a raise at once; a shrink never drops a slot and never goes
  below what the window in force requires: the capacity follows
  ``max(requested, required(window in force))`` down as slots leave. So when
  both change, capacity grows before the window does and the window shrinks
  before capacity does.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller.context import RunContext
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.errors import RetuneRefused
from asyncrl.sampling import PromptGroupSampler, RetunableSampler

log = logging.getLogger("asyncrl.controller")


@dataclasses.dataclass(frozen=True)
class Setting:
    """The three knobs; ``window`` is None for a sampler that cannot re-tune it."""

    max_inflight_prompts: int
    window: int | None
    max_buffered_rollouts: int

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _positive(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RetuneRefused(f"re-tune: {name} must be an integer >= {low}, got {value!r}")
    return value


def configured_setting(sampler: PromptGroupSampler, cfg: AsyncRLConfig) -> Setting:
    """The setting ``cfg`` configures (the window: None for a sampler that cannot re-tune it)."""
    return Setting(cfg.max_inflight_prompts,
                   sampler.window if isinstance(sampler, RetunableSampler) else None,
                   cfg.max_buffered_rollouts)


def checked_setting(base: Setting, sampler: PromptGroupSampler, grpo: GRPOConfig,
                    cfg: AsyncRLConfig, *, deterministic: bool,
                    max_inflight_prompts: int | None = None, window: int | None = None,
                    max_buffered_rollouts: int | None = None) -> Setting:
    """``base`` with the knobs given (None: keep ``base``'s), checked against the
    derived facts of the setting it asks for: raises RetuneRefused when it could
    deadlock or cannot be applied. What :meth:`Retuner.request` and ``asyncrl
    validate`` (a profile to reuse) check."""
    new = Setting(
        _positive("max_inflight_prompts", max_inflight_prompts, 1)
        if max_inflight_prompts is not None else base.max_inflight_prompts,
        _check_window(sampler, window, deterministic) if window is not None else base.window,
        _positive("max_buffered_rollouts", max_buffered_rollouts, 1)
        if max_buffered_rollouts is not None else base.max_buffered_rollouts,
    )
    _check_capacity(new, sampler, grpo, cfg)
    return new


def _check_window(sampler: PromptGroupSampler, window: Any, deterministic: bool) -> int:
    name = type(sampler).__name__
    if not isinstance(sampler, RetunableSampler):
        raise RetuneRefused(
            f"re-tune: sampler {name} cannot change its window while running (it does not "
            "implement asyncrl.sampling.RetunableSampler); leave the window knob out")
    if deterministic:
        raise RetuneRefused(
            "re-tune: deterministic: true pins each batch's weight version from the window; "
            "changing it mid-run would change which weights generate. Leave the window out "
            "or set deterministic: false")
    return _positive("window", window, 0)


def _check_capacity(new: Setting, sampler: PromptGroupSampler, grpo: GRPOConfig,
                    cfg: AsyncRLConfig) -> None:
    n = grpo.num_prompts_per_step
    cap = new.max_buffered_rollouts
    required = _required(sampler, new.window, n)
    if required is not None and cap < required:
        raise RetuneRefused(
            f"re-tune: max_buffered_rollouts={cap} is below the {required} slots "
            f"{type(sampler).__name__} needs with window {new.window} and "
            f"num_prompts_per_step={n}; ask for max_buffered_rollouts >= {required} or a "
            "smaller window")
    if cap < cfg.min_groups_for_streaming_train:
        raise RetuneRefused(
            f"re-tune: max_buffered_rollouts={cap} is below "
            f"async_rl.min_groups_for_streaming_train={cfg.min_groups_for_streaming_train}; "
            "the trainer would wait for more ready groups than the buffer holds")


def _required(sampler: PromptGroupSampler, window: int | None, n: int) -> int | None:
    if window is None or not isinstance(sampler, RetunableSampler):
        return sampler.required_buffer_capacity(n)
    return sampler.required_capacity_for(window, n)


class Retuner:
    """Holds the requested setting and applies it at step boundaries."""

    def __init__(self, ctx: RunContext, dispatcher: Dispatcher, *,
                 deterministic: bool = False) -> None:
        self.ctx = ctx
        self.dispatcher = dispatcher
        self.deterministic = deterministic
        sampler = ctx.sampler
        self._retunable = isinstance(sampler, RetunableSampler)
        #: The setting last asked for (applied or pending).
        self.target = Setting(dispatcher.max_inflight,
                              sampler.window if self._retunable else None,  # type: ignore[attr-defined]
                              ctx.buffer.capacity_target)
        self._pending: Setting | None = None
        #: Every applied change: {"version", "previous", "setting"}.
        self.applied: list[dict[str, Any]] = []
        #: Set by the first change (or a resumed one): from then on every step
        #: boundary lets a window hold expire and the capacity follow it.
        self._active = False

    @property
    def pending(self) -> Setting | None:
        return self._pending

    def request(self, *, max_inflight_prompts: int | None = None, window: int | None = None,
                max_buffered_rollouts: int | None = None) -> Setting:
        """Ask for a new setting (knobs left None keep the last one asked for);
        it is applied at the next step boundary. Raises RetuneRefused, and
        changes nothing, when the setting could deadlock or cannot be applied."""
        ctx = self.ctx
        new = checked_setting(self._pending or self.target, ctx.sampler, ctx.grpo, ctx.cfg,
                              deterministic=self.deterministic,
                              max_inflight_prompts=max_inflight_prompts, window=window,
                              max_buffered_rollouts=max_buffered_rollouts)
        self._pending = new
        return new

    def start_from(self, knobs: dict[str, int]) -> Setting | None:
        """Before the first step, nothing admitted yet (``async_rl.autopilot.reuse``):
        ``knobs`` in force at once, through the checks of :meth:`request`."""
        self.request(**knobs)
        return self.at_step_boundary(self.ctx.version.value)

    # ------------------------------------------------------------- applying
    def at_step_boundary(self, version: int) -> Setting | None:
        """Apply the pending setting (if any) at trainer version ``version``,
        and let a capacity shrink follow an expired window hold; returns the
        setting applied, or None."""
        new, self._pending = self._pending, None
        if new is None and not self._active:
            return None  # never re-tuned: the run is exactly as configured
        sampler, buffer = self.ctx.sampler, self.ctx.buffer
        if self._retunable:
            sampler.step_boundary(version)  # type: ignore[attr-defined]  # a hold may expire
        if new is None:
            self._set_capacity(self.target.max_buffered_rollouts)
            return None
        previous = self.current()
        self._active = True
        if new.max_buffered_rollouts > buffer.capacity_target:
            self._set_capacity(new.max_buffered_rollouts)  # grow before the window
        if new.window is not None and new.window != previous.window:
            sampler.set_window(new.window, version=version)  # type: ignore[attr-defined]
        self.target = new
        self._set_capacity(new.max_buffered_rollouts)  # shrinks after the window
        self.dispatcher.set_max_inflight(new.max_inflight_prompts)
        self.ctx.stats.max_inflight = new.max_inflight_prompts
        record = {"version": version, "previous": previous.as_dict(), "setting": new.as_dict()}
        self.applied.append(record)
        log.info("re-tuned at trainer version %d: %s -> %s", version, previous.as_dict(),
                 new.as_dict())
        return new

    def _set_capacity(self, requested: int) -> None:
        """Capacity ``requested``, but never below what the window in force needs."""
        required = self.ctx.sampler.required_buffer_capacity(self.ctx.grpo.num_prompts_per_step)
        target = max(requested, required or 0)
        if target != self.ctx.buffer.capacity_target:
            self.ctx.buffer.set_capacity(target)

    # ----------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """The setting asked for last (a pending one is not kept: it was never
        applied). The sampler keeps its window in its own state."""
        return {"max_inflight_prompts": self.target.max_inflight_prompts,
                "max_buffered_rollouts": self.target.max_buffered_rollouts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume with the re-tuned bound and capacity; call after the sampler's
        state is loaded and before the buffer's (its slots must fit)."""
        sampler = self.ctx.sampler
        configured = self.target
        self.target = Setting(int(state["max_inflight_prompts"]),
                              sampler.window if self._retunable else None,  # type: ignore[attr-defined]
                              int(state["max_buffered_rollouts"]))
        # The states brought back a re-tuned knob (window included) or a window hold.
        held = self._retunable and sampler.window_in_force(  # type: ignore[attr-defined]
            self.ctx.version.value) != self.target.window
        self._active = self.target != configured or held
        self.dispatcher.set_max_inflight(self.target.max_inflight_prompts)
        self.ctx.stats.max_inflight = self.target.max_inflight_prompts
        self._set_capacity(self.target.max_buffered_rollouts)

    def current(self) -> Setting:
        """The setting in force now (a shrink may still be draining toward it)."""
        sampler = self.ctx.sampler
        return Setting(self.dispatcher.max_inflight,
                       sampler.window if self._retunable else None,  # type: ignore[attr-defined]
                       self.ctx.buffer.capacity_target)
