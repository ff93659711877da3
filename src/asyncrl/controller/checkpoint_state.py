"""The controller's checkpoint state: what ``controller.json`` holds, written
by :meth:`Controller.state_dict <asyncrl.controller.Controller.state_dict>`
and read back by its ``load_state_dict`` before a resumed run.

Kept apart from the roles' hot paths: it runs once per checkpoint and once per
resume. Every value is plain JSON data, and only live groups are stored (the
size does not grow with the run): ready groups with their payloads and stamps,
the dispatcher's in-flight groups (their prompt, stamp, attempt count and the
tokens they had) and queued prompts, the prompt source's position, the ledger,
the run statistics, the re-tuned setting and the autopilot's state. Ready
groups of an interrupted step are kept as ready ones.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from asyncrl.buffer import Slot
from asyncrl.controller.autopilot import Autopilot
from asyncrl.controller.context import RunContext
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.entry import entry_from_dict, entry_to_dict
from asyncrl.controller.retune import Retuner
from asyncrl.errors import CheckpointError
from asyncrl.types import prompt_from_dict, prompt_to_dict, rollout_from_dict, rollout_to_dict

#: controller.json format; 1 was written before the controller kept only live groups,
#: 2 before the per-token record (completions with versions, in-flight tokens).
STATE_FORMAT = 3


def controller_state(ctx: RunContext, dispatcher: Dispatcher, taken: Iterable[Slot],
                     retuner: Retuner, autopilot: Autopilot | None, *,
                     elapsed: float) -> dict[str, Any]:
    """The run's state; ``taken``: the slots of an interrupted step (the train
    pump's), ``elapsed``: the run's seconds so far."""
    buffer, stats = ctx.buffer, ctx.stats
    ready = sorted((s for s in (*buffer.slots(), *taken) if s.ready),
                   key=lambda s: s.dispatch_seq)
    return {
        "format": STATE_FORMAT,
        "trainer_version": ctx.version.value,
        "steps_done": stats.steps_done,
        "next_seq": buffer.state_dict()["next_seq"],
        "sampler": ctx.sampler.state_dict(),
        "ready": [{"group_id": s.group_id, "start_weight": s.start_weight,
                   "end_weight": s.end_weight, "target_step": s.target_step,
                   "dispatch_seq": s.dispatch_seq, "payload": rollout_to_dict(s.payload)}
                  for s in ready],
        "dispatch": dispatch_state(dispatcher),
        "ledger": ctx.ledger.state_dict(),
        "stats": stats.state_dict(elapsed),
        "retune": retuner.state_dict(),
        "autopilot": autopilot.state_dict() if autopilot is not None else None,
    }


def load_controller_state(state: dict[str, Any], ctx: RunContext, dispatcher: Dispatcher,
                          retuner: Retuner, autopilot: Autopilot | None) -> None:
    """Restore a :func:`controller_state` into the roles, before the run."""
    if state.get("format") != STATE_FORMAT:
        raise CheckpointError(
            f"controller state format {state.get('format')!r}; this asyncrl reads format "
            f"{STATE_FORMAT}. The checkpoint was written by another version: start a new run")
    ctx.version.set(int(state["trainer_version"]))
    ctx.stats.load_state_dict(state["stats"], int(state["steps_done"]))
    sampler = ctx.sampler
    sampler.load_state_dict(state["sampler"])
    # The protocol's own way to resume the dispatch index (docs/design.md, "The staleness sampler"):
    # every admitted batch took one index, so the next one is the count.
    sampler.set_dispatch_index(int(state["dispatch"]["admitted"]))
    if "retune" in state:  # the re-tuned bound and capacity (the slots must fit)
        retuner.load_state_dict(state["retune"])
    if autopilot is not None and state.get("autopilot"):  # its counts and latches
        autopilot.load_state_dict(state["autopilot"])
    ctx.buffer.load_state_dict({
        "next_seq": int(state["next_seq"]),
        "slots": [{**r, "ready": True, "payload": rollout_from_dict(r["payload"])}
                  for r in state["ready"]],
    })
    ctx.ledger.load_state_dict(state["ledger"])
    load_dispatch_state(dispatcher, state["dispatch"])


def dispatch_state(dispatcher: Dispatcher) -> dict[str, Any]:
    """The dispatcher's groups in flight (kept with their ids and attempts) and
    queued prompts, and the prompt source's position."""
    ctx, source = dispatcher.ctx, dispatcher.source
    return {
        "next_group": dispatcher.next_group,
        "admitted": dispatcher.admitted,
        "inflight": [entry_to_dict(e) for e in dispatcher.active.values()],
        "queued": [entry_to_dict(e) for e in dispatcher.queue],
        "source": source.source.state_dict(),
        "source_held": [prompt_to_dict(p) for p in source.held],
        "source_exhausted": source.exhausted,
        "source_drawn": source.drawn,
        "drops": ctx.drops.state_dict(),
        **({"dynamic_sampling": ctx.dynamic.state_dict()} if ctx.dynamic is not None else {}),
    }


def load_dispatch_state(dispatcher: Dispatcher, state: dict[str, Any]) -> None:
    """Resume: in-flight groups go first (same ids, stamps and attempts), then
    the queued prompts; none of them passes through ``admit`` again."""
    ctx, source = dispatcher.ctx, dispatcher.source
    dispatcher.next_group = int(state["next_group"])
    dispatcher.admitted = int(state["admitted"])
    dispatcher.queue = collections.deque(
        entry_from_dict(d) for d in (*state["inflight"], *state["queued"]))
    dispatcher.batch_left = sum(e.batch for e in dispatcher.queue)
    source.source.load_state_dict(state["source"])
    source.held = collections.deque(prompt_from_dict(p) for p in state["source_held"])
    source.exhausted = bool(state["source_exhausted"])
    ctx.drops.load_state_dict(state.get("drops", {}))
    if ctx.dynamic is not None:
        ctx.dynamic.load_state_dict(state.get("dynamic_sampling", {}), admitted=dispatcher.admitted)
    # A checkpoint from before the count: every prompt read is dispatched or waits.
    source.drawn = int(state.get("source_drawn", dispatcher.next_group + sum(
        len(ids) for ids in dispatcher.undispatched().values())))


__all__ = ["STATE_FORMAT", "controller_state", "dispatch_state", "load_controller_state",
           "load_dispatch_state"]
