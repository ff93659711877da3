"""What a plan starts from: the run's live groups at a step boundary (issue 38).

The model-based autopilot (:mod:`asyncrl.controller.autoplan`) hands its
planner a :class:`RunState` with every
:class:`~asyncrl.controller.autoplan.PlanRequest`, and the built-in planner
starts its simulation of each candidate from it (:mod:`asyncrl.sim.seed`):
the groups generating (since when, at which start weight), the finished groups
waiting in the buffer (their versions and tokens), the prompts admitted but
not yet placed, and the trainer's version and the sampler's own state (its
window, a window hold, its dispatch index).

It is taken only when a plan is asked for: the controller keeps nothing for
it on its hot path, and :func:`run_state` costs one pass over the live
groups. It is plain data (small named tuples of numbers), so it crosses into
the planner's process cheaply.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from asyncrl.controller.context import RunContext
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.entry import EntryState

#: What an in-flight group is doing (:attr:`LiveGroup.phase`), by its entry state.
_PHASES = {EntryState.GENERATING: "generating", EntryState.BACKOFF: "backoff",
           EntryState.SCORING: "scoring", EntryState.COMMIT_WAIT: "scoring"}


class LiveGroup(NamedTuple):
    """A group that holds a buffer slot: finished (``ready``) or in flight."""

    start_weight: int
    target_step: int | None
    #: ``ready``: the newest version that sampled its tokens; in flight: None.
    end_weight: int | None
    #: ``ready``: its completions' tokens in all; in flight: 0.
    tokens: int
    #: ``ready``; or in flight: ``generating``, ``scoring`` (generated, its
    #: rewards being computed) or ``backoff`` (a failed attempt, waiting to retry).
    phase: str
    #: ``generating``: the seconds its attempt has run (the run's clock at the
    #: boundary less the group's dispatch time). None where that is not known:
    #: a later attempt (when it started is not kept), a group resumed from a
    #: checkpoint (its dispatch time is another process's clock), not generating.
    age_s: float | None
    attempts: int


class QueuedPrompt(NamedTuple):
    """A prompt waiting for an in-flight permit or a buffer slot: admitted in
    a dispatch batch, or a replacement (``batch`` False)."""

    target_step: int | None
    batch_index: int | None
    batch: bool


@dataclasses.dataclass(frozen=True)
class RunState:
    """The run at a step boundary: see the module docstring."""

    #: The trainer version (the next step trains at it).
    version: int
    #: Dispatch batches admitted so far (the next one's index).
    admitted: int
    #: ``sampler.state_dict()``: the window in force and a hold, the dispatch index.
    sampler: dict[str, Any]
    #: Every group holding a buffer slot, in dispatch order.
    groups: tuple[LiveGroup, ...]
    #: The prompts waiting for a permit or a slot, in queue order.
    queued: tuple[QueuedPrompt, ...]
    #: The run's clock at the boundary on the step records' clock (their
    #: ``wall_time_s``; None: not known): with it, an in-flight group's
    #: dispatch time is ``clock_s - age_s``, which the latency fit needs to
    #: tell the groups dispatched inside its window from the older ones.
    clock_s: float | None = None

    @property
    def inflight(self) -> int:
        """Groups in flight (holding a slot that is not ready)."""
        return sum(g.end_weight is None for g in self.groups)


def run_state(ctx: RunContext, dispatcher: Dispatcher) -> RunState:
    """The run's :class:`RunState` now (at a step boundary: no step holds groups)."""
    now, ledger, active = ctx.now(), ctx.ledger, dispatcher.active
    groups = []
    for slot in ctx.buffer.slots():
        rec = ledger[slot.group_id]
        if slot.ready:
            groups.append(LiveGroup(slot.start_weight, slot.target_step, slot.end_weight,
                                    rec.tokens or 0, "ready", None, rec.attempts or 1))
            continue
        # Every reserved slot is an active entry of the dispatcher (until it commits or ends).
        entry = active[slot.group_id]
        phase = _PHASES[entry.state]
        known = phase == "generating" and entry.attempts == 1 and entry.prefix is None
        groups.append(LiveGroup(slot.start_weight, slot.target_step, None, 0, phase,
                                max(0.0, now - rec.dispatch_time) if known else None,
                                entry.attempts))
    queued = tuple(QueuedPrompt(e.stamp, e.batch_index, e.batch) for e in dispatcher.queue)
    return RunState(ctx.version.value, dispatcher.admitted, ctx.sampler.state_dict(),
                    tuple(groups), queued, now - ctx.stats.t0)


__all__ = ["LiveGroup", "QueuedPrompt", "RunState", "run_state"]
