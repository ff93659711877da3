"""Cohort mode: the built-in policies replayed on a plain event queue.

The per-group mode (:func:`asyncrl.sim.runner.simulate`) runs the real
Controller, with an asyncio task per group, under virtual time: about 10^4
groups per second of wall time. A datacenter step (4,096 groups on 32,768
generation slots) needs ten times that to simulate 1,000 steps in a minute.
Cohort mode (``simulate.mode: cohort``) drops the Controller and the event
loop and replays the same rules on a heap of finish times:

* **dispatch**: batches of ``num_prompts_per_step`` prompts, each admitted once
  the previous one left the queue and (gated policies) ``d <= v + s``; a
  queued prompt is reserved when fewer than ``max_inflight_prompts`` groups
  are in flight and the buffer (in flight + ready) is below
  ``max_buffered_rollouts``; its start weight is the trainer version then;
* **the fleet**: ``rollout_slots`` slots, FIFO; the first attempt of prompt
  ``k`` takes the ``k``-th latency of the same seeded stream as the per-group
  engine (common random numbers: both modes see the very same workload);
* **the trainer**: per step, evict then take a chunk of at least
  ``min(min_groups_for_streaming_train, remaining)`` eligible groups (any
  eligible ones when nothing more can arrive), train it, and after the quota
  the optimizer step and the weight sync; after the sync, in-flight groups the
  policy calls hopeless are aborted;
* **tokens**: each group's tokens split into version spans where updates
  landed (:func:`asyncrl.sim.tokens.version_spans`), which give the token
  staleness, the end weight and the masked tokens (counted per trained chunk
  at once, :func:`asyncrl.sim.tokens.tokens_by_version`).

Groups that start together with latencies from one distribution form a
cohort: their finishes are one stream of events, merged with the others by
time. Only live groups are held (in flight or ready), so memory does not grow
with the run; per-step records past :data:`KEEP_RECORDS` are kept as
aggregates only.

What it covers (:func:`check` refuses the rest, naming the field): built-in
samplers (not ``sample_freshest_first``), time-based latency models, no
failures, no dynamic-sampling filter rate or over-sampling, no pause during
sync, no abort time, not deterministic.
docs/simulate.md compares the two modes.
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
import time
from collections.abc import Callable
from operator import attrgetter
from typing import Any

from asyncrl._util.collector import fewer_gc_passes
from asyncrl.buffer import RolloutBuffer
from asyncrl.config import RunConfig
from asyncrl.controller.stats import KEEP_RECORDS
from asyncrl.controller.validation import validate_setup
from asyncrl.errors import RolloutStall
from asyncrl.sampling import create_sampler
from asyncrl.sim.cohort_fleet import Fleet, Group
from asyncrl.sim.cohort_policies import (
    GONE,
    READY,
    RUNNING,
    WAITING,
    Policy,
    check,
    make_policy,
)
from asyncrl.sim.latency import LatencyModel, Work
from asyncrl.sim.tokens import last_version, tokens_by_version

_START_WEIGHT = attrgetter("sw")
#: Steps whose slot occupancy and trainer intervals are kept for the timeline plot.
TIMELINE_STEPS = 20
#: Slots whose occupancy is kept for it (a datacenter fleet has too many to draw).
TIMELINE_SLOTS = 64


class CohortRun:
    """One cohort-mode run (see the module docstring); :meth:`run` returns the totals."""

    def __init__(self, cfg: RunConfig, sampler_cfg: Any, latency: LatencyModel, steps: int,
                 *, record_intervals: bool,
                 on_step: Callable[[int], None] | None = None) -> None:
        sim = cfg.simulate
        assert sim is not None
        self.sim, self.steps, self.on_step = sim, steps, on_step
        self.n = cfg.grpo.num_prompts_per_step
        self.n_gen = cfg.grpo.num_generations_per_prompt
        self.min_chunk = cfg.async_rl.min_groups_for_streaming_train
        self.cap_inflight = cfg.async_rl.max_inflight_prompts
        self.capacity = cfg.async_rl.max_buffered_rollouts
        self.bound = cfg.loss.max_token_staleness
        self.mask_truncated = cfg.loss.truncated == "mask"
        self.policy: Policy = make_policy(sampler_cfg)
        self.yields_after_sync = (self.policy.window == 0
                                  or cfg.async_rl.recompute_kv_cache_after_weight_updates)
        self.fleet = Fleet(latency, slots=sim.rollout_slots, seed=cfg.seed,
                           tokens_per_s=sim.tokens_per_s)
        self.record_intervals = record_intervals
        if record_intervals:
            self.fleet.slot_ids = list(range(sim.rollout_slots - 1, -1, -1))
        self.now = 0.0
        self.v = 0
        self.updates: list[tuple[float, int]] = []  # (time, version) of every sync
        self.update_times: list[float] = []  # the same times alone
        self.heap: list[tuple[float, int, Group]] = []  # finishes of running groups
        # Dispatch: the admitted batch's prompts not yet reserved, [next, end).
        self.admitted = 0
        self.queue_next = self.queue_end = 0
        self.queue_stamp: int | None = None
        self.dispatched = 0  # groups reserved so far (the next one's dispatch number)
        self.inflight = 0
        # Ledger and statistics.
        self.counts = collections.Counter[str]()
        self.staleness: collections.Counter[int] = collections.Counter()
        self.token_staleness: collections.Counter[int] = collections.Counter()
        self.tokens_trained = self.tokens_masked = 0
        self.idle_total = 0.0
        self.records: list[dict[str, Any]] = []
        self.timeline: list[dict[str, Any]] = []

    # ------------------------------------------------------------- dispatch
    def _place(self) -> bool:
        """Admit and reserve every prompt the bounds allow now; True when none can
        be until the trainer acts (the admission gate holds the next batch or the
        buffer, in flight + ready, is full)."""
        policy = self.policy
        while True:
            if self.queue_next == self.queue_end:
                d = self.admitted
                if not policy.admits(d, self.v):
                    return True
                self.admitted = d + 1
                self.queue_next, self.queue_end = d * self.n, (d + 1) * self.n
                self.queue_stamp = policy.stamp(d)
            inflight = self.inflight
            if inflight + policy.ready >= self.capacity:
                return True
            if inflight >= self.cap_inflight:
                return False
            self._reserve(min(self.queue_end - self.queue_next, self.cap_inflight - inflight,
                              self.capacity - inflight - policy.ready))

    def _reserve(self, k: int) -> None:
        """The next ``k`` queued prompts are reserved now, in order: as many as
        there are free slots start, the others wait for one (FIFO)."""
        seq, prompt, stamp, v = self.dispatched, self.queue_next, self.queue_stamp, self.v
        self.dispatched += k
        self.queue_next += k
        self.inflight += k
        groups = list(map(Group, range(seq, seq + k), range(prompt, prompt + k),
                          itertools.repeat(stamp, k), itertools.repeat(v, k)))
        policy, fleet = self.policy, self.fleet
        if policy.counts_live:
            for g in groups:
                policy.placed(g)
        start = min(k, fleet.free)
        if start:
            fleet.free -= start
            fleet.max_busy = max(fleet.max_busy, fleet.slots - fleet.free)
            # Free slots mean nobody waits: these prompts are the next to start.
            self._start(groups[:start] if start < k else groups, fleet.first.run(prompt, start))
        if start < k:
            fleet.waiting.extend(groups[start:])

    def _start(self, groups: list[Group], works: list[Work]) -> None:
        """``groups`` take a slot now; ``works`` are their first attempts."""
        fleet = self.fleet
        fleet.attempts += len(groups)
        # The engine version it starts with is the number of updates landed:
        # every sync appends one and makes the next version (v == len(updates)).
        now, since = self.now, len(self.updates)
        heap, push = self.heap, heapq.heappush
        for g, work in zip(groups, works):
            g.state, g.t0, g.since, g.work = RUNNING, now, since, work
            push(heap, (now + work.latency, g.seq, g))
        if self.record_intervals:
            for g in groups:
                g.slot = fleet.slot_ids.pop()

    def _free_slot(self, g: Group, outcome: str) -> None:
        fleet = self.fleet
        fleet.busy_slot_s += self.now - g.t0
        if self.record_intervals:
            fleet.slot_ids.append(g.slot)
            if g.slot < TIMELINE_SLOTS and self.v <= TIMELINE_STEPS:
                fleet.intervals.append((g.t0, self.now, outcome))
        while fleet.waiting:
            nxt = fleet.waiting.popleft()
            if nxt.state == WAITING:
                self._start([nxt], [fleet.first.at(nxt.prompt)])
                return
        fleet.free += 1

    def _finish_until(self, limit: float) -> None:
        """Every group whose last token comes by ``limit`` finishes, in (time,
        dispatch) order: its slot frees and it is ready. The trainer does not act
        meanwhile (the caller's invariant), so nothing else happens in between."""
        heap, updates, fleet = self.heap, self.updates, self.fleet
        n_updates = len(updates)  # no sync lands while groups finish
        pop, newest = heapq.heappop, last_version
        end_weight = self.policy.measure == "end_weight"
        slow, waiting = self.record_intervals, fleet.waiting  # only shrinks in here
        ready: list[Group] = []  # finished, in order (the policy takes them at once)
        freed = 0
        busy = fleet.busy_slot_s  # summed here in the same order as in _free_slot
        while heap and heap[0][0] <= limit:
            now, _, g = pop(heap)
            if g.state != RUNNING:  # aborted meanwhile
                continue
            if slow or waiting:
                fleet.busy_slot_s, self.now = busy, now
                self._free_slot(g, "ok")
                busy = fleet.busy_slot_s
            else:  # nobody waits for the slot
                busy += now - g.t0
                freed += 1
            # Versions are counted when trained (_train); end weights are needed now.
            g.until = n_updates
            if end_weight:
                since = g.since
                g.ew = since if since == n_updates else \
                    newest(g.work.longest, g.work, g.t0, since, updates, since)
            g.state = READY
            ready.append(g)
        fleet.busy_slot_s = busy
        fleet.free += freed
        self.policy.add_ready(ready)
        self.inflight -= len(ready)
        self.now = limit

    def _abort_hopeless(self) -> int:
        """After a sync: abort the in-flight groups the policy calls hopeless in the
        controller's order (start weight, dispatch number: dispatch order)."""
        policy, v = self.policy, self.v
        if not (policy.aborts_inflight and self.inflight):
            return 0
        # In flight: running (one event each in the heap) or waiting for a slot.
        live = [g for _, _, g in self.heap if g.state == RUNNING]
        live += [g for g in self.fleet.waiting if g.state == WAITING]
        doomed_w = {w for w in {g.sw for g in live} if policy.aborts(w, v)}
        if not doomed_w:
            return 0
        doomed = sorted((g for g in live if g.sw in doomed_w), key=attrgetter("seq"))
        self.inflight -= len(doomed)
        for g in doomed:
            if policy.counts_live:
                policy.left(g)
            was = g.state
            g.state = GONE
            if was == RUNNING:
                self.fleet.aborts += 1
                self._free_slot(g, "aborted")
        self.counts["aborted"] += len(doomed)
        return len(doomed)

    # -------------------------------------------------------------- trainer
    def _starved(self) -> bool:
        """Nothing can become ready until the trainer acts (Dispatcher.starved):
        nothing in flight, and the queue's head waits on a full buffer or the
        admission gate holds the next batch."""
        if self.inflight:
            return False
        if self.queue_next < self.queue_end:
            return self.inflight + self.policy.ready >= self.capacity
        return not self.policy.admits(self.admitted, self.v)

    def _chunk(self) -> list[Group] | None:
        """Evict, then the next chunk of the step (None: wait for groups)."""
        policy, v = self.policy, self.v
        evicted = policy.evict(v)
        self._leave(evicted)
        self.step_evicted += len(evicted)
        remaining = self.n - self.taken
        have = min(policy.eligible(v), remaining)
        if have < min(self.min_chunk, remaining) and not (have and self._starved()):
            return None
        chunk = policy.take(v, have)
        self._leave(chunk)
        return chunk

    def _leave(self, groups: list[Group]) -> None:
        """``groups`` leave the buffer (trained or evicted)."""
        for g in groups:
            g.state = GONE
        if self.policy.counts_live:
            for g in groups:
                self.policy.left(g)

    def _train(self, chunk: list[Group]) -> float:
        """Account a trained chunk; its training time."""
        v = self.v
        # Token staleness per version first (a chunk spans a few versions), then
        # per completion: each group's completions are alike (time-based models).
        by_version = tokens_by_version(chunk, self.update_times) if chunk else {}
        tokens = sum(by_version.values())
        by_start = collections.Counter(map(_START_WEIGHT, chunk))
        n_gen = self.n_gen
        oldest = -1 if self.bound is None else v - self.bound
        for version, count in by_version.items():
            self.token_staleness[v - version] += count * n_gen
            if version < oldest:
                self.tokens_masked += count * n_gen
        for w, count in by_start.items():
            self.staleness[v - w] += count
            self.step_staleness += (v - w) * count
            self.step_hist[v - w] += count
        tokens *= n_gen
        self.tokens_trained += tokens
        self.taken += len(chunk)
        return self.sim.train_per_group_s * len(chunk) + self.sim.train_per_token_s * tokens

    # ------------------------------------------------------------------ run
    def run(self) -> None:
        """Events in time order. At one instant, as the controller's tasks do:
        every group finishing then commits, the trainer acts (until it has to
        wait or to spend time), then the dispatcher fills what was freed."""
        heap, inf = self.heap, math.inf
        self._begin_step()
        self.phase, self.until = "wait", 0.0
        while True:
            if self.phase == "wait":
                self._trainer_acts()
            if self._place() and self.phase != "wait":
                # Until the trainer's phase ends only groups finish, and a finish
                # moves a group from in flight to ready: a full buffer stays full
                # and a closed gate closed, so they all finish in one go.
                self._finish_until(self.until)
            t_group = heap[0][0] if heap else inf
            if self.phase != "wait" and self.until < t_group:
                if self._trainer_event():
                    return
                continue
            if t_group == inf:
                raise RolloutStall(f"deadlock at step {self.v} in cohort mode: the trainer "
                                   "waits and nothing is in flight")
            self._finish_until(t_group)

    def _trainer_acts(self) -> None:
        """The waiting trainer takes chunks while it can; its next phase."""
        while True:
            chunk = self._chunk()
            if chunk is None:
                if not self.heap and self._starved():
                    raise RolloutStall(f"deadlock at step {self.v} in cohort mode: no group can "
                                       "arrive and none is eligible")
                return
            now = self.now
            self.idle_total += now - self.wait_since
            self.step_idle += now - self.wait_since
            cost = self._train(chunk)
            self._interval("train", now, now + cost)
            if self.taken == self.n:
                if cost + self.sim.train_step_s > 0:
                    self.phase, self.until = "step", now + cost + self.sim.train_step_s
                    self._interval("step", now + cost, self.until)
                else:  # the controller's train pump goes straight into the sync
                    self._sync()
                return
            if cost > 0:
                self.phase, self.until = "chunk", now + cost
                return
            self.wait_since = now

    def _sync(self) -> None:
        """The weight sync starts (the dispatcher gets a turn before it lands,
        as the controller's train pump awaits the engines even for 0 s)."""
        self.phase, self.until = "sync", self.now + self.sim.weight_sync_s
        self._interval("sync", self.now, self.until)

    def _trainer_event(self) -> bool:
        """The trainer's phase ends at ``until``; True when the run is over."""
        self.now = self.until
        if self.phase == "chunk":
            self.phase, self.wait_since = "wait", self.now
        elif self.phase == "step":
            self._sync()
        else:  # the sync landed: version v + 1
            if self._end_step():
                return True
            self.phase = "wait"
        return False

    def _begin_step(self) -> None:
        self.taken = self.step_evicted = self.step_staleness = 0
        self.step_hist: collections.Counter[int] = collections.Counter()
        self.step_idle = 0.0
        self.step_start = self.wait_since = self.now

    def _end_step(self) -> bool:
        """The sync to version v + 1 landed; True when the run is over."""
        step = self.v
        self.v += 1
        self.updates.append((self.now, self.v))
        self.update_times.append(self.now)
        aborted = self._abort_hopeless()
        self.counts["trained"] += self.taken
        self.counts["evicted"] += self.step_evicted
        if len(self.records) < KEEP_RECORDS:
            self.records.append({
                "step": step, "wall_time_s": self.now, "step_time_s": self.now - self.step_start,
                "groups_trained": self.taken, "groups_evicted": self.step_evicted,
                "groups_aborted": aborted, "trainer_idle_s": self.step_idle,
                "staleness_mean": self.step_staleness / self.taken if self.taken else 0.0,
                "staleness_hist": {str(k): self.step_hist[k] for k in sorted(self.step_hist)},
                "inflight": self.inflight, "buffer_ready": self.policy.ready})
        if self.on_step is not None:
            self.on_step(self.v)
        if self.yields_after_sync:
            # The controller's train pump awaits the engines' cache invalidation
            # here: the dispatcher fills what the sync freed before the trainer
            # goes on (or the run stops).
            self._place()
        if self.v >= self.steps:
            self._stop()
            return True
        self._begin_step()
        return False

    def _stop(self) -> None:
        """The run ends: groups still generating stop now (their slot time counts)."""
        for _, _, g in self.heap:
            if g.state == RUNNING:
                self.fleet.busy_slot_s += self.now - g.t0

    def _interval(self, kind: str, start: float, end: float) -> None:
        if self.record_intervals and self.v < TIMELINE_STEPS and end > start:
            self.timeline.append({"kind": kind, "lane": 0, "start": start, "end": end,
                                  "label": str(self.v)})


def simulate_cohort(cfg: RunConfig, sampler_cfg: Any, latency: LatencyModel, steps: int, *,
                    record_intervals: bool = True,
                    on_step: Callable[[int], None] | None = None) -> tuple[CohortRun, float]:
    """Run cohort mode; returns the finished run and its wall seconds."""
    check(cfg, sampler_cfg, latency)
    sampler = create_sampler(RolloutBuffer(cfg.async_rl.max_buffered_rollouts), sampler_cfg)
    async_rl = cfg.async_rl.model_copy(update={"sampler": sampler_cfg})
    validate_setup(sampler, cfg.grpo, async_rl, deterministic=False)
    run = CohortRun(cfg, sampler_cfg, latency, steps, record_intervals=record_intervals,
                    on_step=on_step)
    t0 = time.perf_counter()
    with fewer_gc_passes():
        run.run()
    return run, time.perf_counter() - t0


__all__ = ["CohortRun", "Fleet", "check", "simulate_cohort"]
