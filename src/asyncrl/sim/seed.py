"""Start a simulation from a run's state: the planner's "now" (issue 38).

The model-based autopilot sends its planner the run's live groups at the
decision's step boundary (:class:`~asyncrl.controller.snapshot.RunState`).
:func:`start_of` turns that state and the fitted latencies into a
:class:`Start`, drawing once what each in-flight group has left to generate
(:func:`remaining`), so that every candidate of a plan starts from the same
draws (common random numbers: the differences are the settings'). :func:`seed`
loads a :class:`Start` into a simulation's controller and engine before the
run, through the roles' own state loaders (``simulate(start_state=...)``):

* the trainer and the fleet are at the run's version. Every version number in
  the simulation is the run's own - the start weights and target steps of the
  groups, the sampler's window hold and dispatch index - so nothing is shifted
  and the sampler gates, selects and evicts exactly as it would in the run;
* the buffer holds the run's slots in their dispatch order: the finished
  groups ready (their start and end weights, and their tokens, which the
  simulated trainer charges for), the in-flight ones reserved. The ledger has
  a live record of each, so every seeded group ends in exactly one state in
  the simulation, as every group does in the run (the end-of-run balance
  check covers them);
* the in-flight groups are adopted by the dispatcher
  (:meth:`~asyncrl.controller.dispatch.Dispatcher.adopt`): each holds a permit
  whatever the in-flight bound (in the run it holds one, and a shrink aborts
  nothing), and its attempt holds a generation slot for the seconds it has
  left;
* the prompts admitted but not yet placed wait at the head of the queue.

Not carried: the tokens the in-flight groups generated so far (a seeded
group's tokens are all sampled from the simulation's start on: its group
staleness, which the bounds are checked on, is exact; its token staleness
reads low), the drop policy's and dynamic sampling's counts, engine-side
queueing (a group's age is counted from its dispatch, as the fitted latencies
are: the controller's attempt times).
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import random
import statistics
from collections.abc import Sequence
from typing import Any

from asyncrl.controller import Controller
from asyncrl.controller.checkpoint_state import load_dispatch_state
from asyncrl.controller.entry import Entry
from asyncrl.controller.snapshot import LiveGroup, RunState
from asyncrl.sim.backends import SimEngine
from asyncrl.sim.latency import Work
from asyncrl.sim.tokens import CompletionFactory
from asyncrl.types import GroupResult, Prompt, Rollout

#: An in-flight group's latency is drawn among the fitted latencies longer than
#: its age when at least this many are; else from the fitted tail (:func:`remaining`).
MIN_ABOVE = 8
#: The tail's draw never reaches further than this quantile (``inv_cdf(1)`` is infinite).
_TOP = 1.0 - 1e-12


@dataclasses.dataclass(frozen=True)
class Start:
    """A run's state and what each of its in-flight groups has left."""

    state: RunState
    #: ``(seconds left, whole latency)`` of each in-flight group, in the order
    #: of ``state.groups``.
    left: tuple[tuple[float, float], ...]


class Tail:
    """The fitted latencies, sorted, and the lognormal fitted to them (None when
    fewer than two distinct positive latencies leave nothing to fit)."""

    def __init__(self, latencies: Sequence[float]) -> None:
        self.ordered = sorted(latencies)
        logs = [math.log(x) for x in self.ordered if x > 0]
        self.lognormal = (statistics.NormalDist.from_samples(logs)
                          if len(set(logs)) >= 2 else None)

    def draw(self, rng: random.Random) -> float:
        """A latency of a group that starts now (the empirical model's bootstrap)."""
        ordered = self.ordered
        return ordered[int(rng.random() * len(ordered))]

    def beyond(self, age: float, rng: random.Random) -> float:
        """A latency drawn from the fitted distribution conditioned on exceeding
        ``age``: uniformly among the fitted latencies longer than it when at
        least :data:`MIN_ABOVE` are (the empirical model's own conditional);
        else from the lognormal fitted to all of them (log-mean, log-sd),
        conditioned by drawing its CDF uniformly above ``age``'s (a heavy tail's
        shape where the window saw too few: right after the latency grows, the
        groups in flight are older than nearly every latency that finished).
        Without a lognormal (no spread to fit) the group is taken to start over:
        ``age`` plus a fresh draw."""
        ordered = self.ordered
        i = bisect.bisect_right(ordered, age)
        above = len(ordered) - i
        if above >= MIN_ABOVE:
            return ordered[i + int(rng.random() * above)]
        if self.lognormal is None or age <= 0:
            return age + self.draw(rng)
        p = self.lognormal.cdf(math.log(age))
        u = min(p + (1.0 - p) * rng.random(), _TOP)
        # Past the _TOP quantile the fitted tail has nothing left: it ends at once.
        return max(age, math.exp(self.lognormal.inv_cdf(u)))


def remaining(group: LiveGroup, tail: Tail, rng: random.Random) -> tuple[float, float]:
    """``(seconds left, whole latency)`` of an in-flight ``group``: generating
    for a known age, the latency conditioned on exceeding it
    (:meth:`Tail.beyond`); scoring, nothing left (its tokens: a fresh draw's);
    waiting to retry, or of an unknown age, a whole fresh draw."""
    if group.phase == "scoring":
        return 0.0, tail.draw(rng)
    if group.phase == "generating" and group.age_s is not None:
        whole = tail.beyond(group.age_s, rng)
        return whole - group.age_s, whole
    whole = tail.draw(rng)
    return whole, whole


def start_of(state: RunState, latencies: Sequence[float], rng: random.Random) -> Start:
    """``state`` with what each in-flight group has left, drawn with ``rng``
    from the fitted ``latencies`` (the planner's fit, which already counts
    these groups' ages as censored observations: :mod:`asyncrl.sim.survival`)."""
    tail = Tail(latencies)
    return Start(state, tuple(remaining(g, tail, rng) for g in state.groups
                              if g.end_weight is None))


def seed(controller: Controller, engine: SimEngine, start: Start, capacity: int) -> None:
    """Before ``controller.run()``: load ``start`` (the module docstring).
    ``capacity``: the buffer capacity in force in the run (the controller's
    own may be larger, to hold the slots: it follows down as they leave)."""
    state, n = start.state, controller.grpo.num_generations_per_prompt
    controller.version.set(state.version)
    controller.sampler.load_state_dict(state.sampler)
    controller.sampler.set_dispatch_index(state.admitted)
    factory = CompletionFactory()
    slots, records, adopted, left = [], [], [], {}
    draws = iter(start.left)
    for gid, group in enumerate(state.groups):  # group ids and prompt ids: 0, 1, ...
        ready = group.end_weight is not None
        prompt = Prompt(gid, "")
        slots.append({"group_id": gid, "start_weight": group.start_weight,
                      "target_step": group.target_step, "dispatch_seq": gid, "ready": ready,
                      "end_weight": group.end_weight,
                      "payload": _rollout(factory, gid, prompt, group, n) if ready else None})
        records.append({"group_id": gid, "prompt_id": gid, "target_step": group.target_step,
                        "start_weight": group.start_weight, "dispatch_time": 0.0,
                        "attempts": group.attempts, "state": "ready" if ready else "inflight",
                        "end_weight": group.end_weight, "tokens": group.tokens or None})
        if not ready:  # its next attempt is the one it runs: the runner counts it again
            adopted.append(Entry(prompt, group.target_step, group_id=gid,
                                 attempts=group.attempts - 1, start_weight=group.start_weight))
            left[gid] = next(draws)
    controller.buffer.load_state_dict({"next_seq": len(slots), "slots": slots})
    # The bound and capacity in force (the capacity follows down to it as slots
    # leave), and the window with any hold the sampler's state brought.
    controller.retuner.load_state_dict({"max_inflight_prompts": controller.cfg.max_inflight_prompts,
                                        "max_buffered_rollouts": capacity})
    controller.ledger.load_state_dict({"format": 2, "live": records, "counts": {}})
    load_dispatch_state(controller.dispatcher, _dispatch_state(state, len(slots)))
    controller.dispatcher.adopt(adopted)
    engine.start_from(state.version, left)


def _dispatch_state(state: RunState, first_id: int) -> dict[str, Any]:
    """The dispatcher's state: the queued prompts (ids after the seeded groups'),
    then the task's prompts from the next id on."""
    queued = [{"prompt": {"prompt_id": first_id + i, "text": ""}, "target_step": q.target_step,
               "pin": None, "batch": q.batch, "group_id": None, "attempts": 0,
               "batch_index": q.batch_index} for i, q in enumerate(state.queued)]
    position = first_id + len(queued)
    return {"next_group": first_id, "admitted": state.admitted, "inflight": [],
            "queued": queued, "source": {"position": position}, "source_held": [],
            "source_exhausted": False, "source_drawn": position, "drops": {}}


def _rollout(factory: CompletionFactory, gid: int, prompt: Prompt, group: LiveGroup,
             n: int) -> Rollout:
    """A finished group's payload: ``n`` completions of its tokens, the first
    half sampled at its start weight and the rest at its end weight."""
    assert group.end_weight is not None
    length = max(1, round(group.tokens / n))
    work = Work(1.0, 0.0, 1.0 / length, length, float(length))
    updates = [(0.5, group.end_weight)] if group.end_weight > group.start_weight else []
    completions = factory.group(n, work, 0.0, group.start_weight, updates)
    rewards = [1.0] + [0.0] * (n - 1)  # a group with signal, as the simulated engine's
    return Rollout(gid, prompt, GroupResult(gid, [0], completions, group.start_weight, rewards),
                   rewards, group.target_step, group.attempts)


__all__ = ["MIN_ABOVE", "Start", "Tail", "remaining", "seed", "start_of"]
