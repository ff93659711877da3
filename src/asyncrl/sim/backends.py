"""Simulated engine, trainer and task: the real protocols, with time instead of work.

The engine is here; the trainer is in :mod:`asyncrl.sim.trainer` and the task in
:mod:`asyncrl.sim.task` (all three importable from this module).

They only ever wait on the event loop's clock, so under
:func:`asyncrl.sim.clock.run_virtual` a 1,000-step run takes seconds of wall
time while the unmodified :class:`~asyncrl.controller.Controller` drives them.

Modelling choices (docs/simulate.md explains them for users):

* **The fleet** is one :class:`SimEngine` with ``rollout_slots`` concurrent
  generation slots (a FIFO pool, :mod:`asyncrl.sim.slots`). A group holds a slot for its
  sampled latency; groups the controller dispatches beyond the free slots queue
  in FIFO order, and the call that frees a slot starts the next one (its task
  wakes once, when its generation ends). The controller's
  ``max_inflight_prompts`` is a separate, earlier bound, so it may be larger
  (groups queue here) or smaller (slots idle).
* **Latencies are tied to prompts**: the first attempt of prompt ``k`` takes
  the ``k``-th draw of a seeded stream, whatever order groups are dispatched in.
  Comparing policies on one config therefore compares them on the very same
  workload (common random numbers), which keeps the differences in the table
  due to the policy and not to sampling noise. Whether a first attempt fails
  is tied to its prompt the same way, from a separate stream, so enabling
  failures does not change any latency. Retries draw latency and failure from
  streams of their own, in the order they happen.
* **Weight sync** happens in :meth:`SimEngine.update_weights`, which sleeps
  ``weight_sync_s``. The train pump awaits it after the optimizer step and
  before the trainer version advances, so it counts as trainer-busy time, and
  the fleet keeps generating on the old weights meanwhile (as a non-colocated
  engine does while weights stream in) - or, with ``pause_during_sync``, stands
  still until the new weights are in (as vLLM does: it pauses its running
  requests while it loads weights). Token timings and latencies then run on an
  *active* clock that stops during pauses.
* **Load**: with the time-based latency models a group's latency is fixed when
  it starts. With ``tokens`` (lengths and a per-token cost that grows with the
  groups decoding) the fleet is a continuous-batching engine: after ``base_s``
  a group decodes one token per decode step, and a step takes longer the more
  groups decode, whenever they join or leave (:mod:`asyncrl.sim.sharing`).
* **Tokens** (:mod:`asyncrl.sim.tokens`): a group's completions generate their
  tokens over its latency, and each token carries the weight version the
  engine held when it was sampled, so a group that spans an update reports
  the update at the right token.
* **Rewards** say only whether a group carries signal: with probability
  ``filter_rate`` all of a group's rewards are equal (``[0, 0, ...]``: what
  ``grpo.dynamic_sampling``'s ``zero_variance`` filter drops at commit),
  otherwise one completion is right (``[1, 0, ...]``). Which prompts come back
  flat is tied to the prompt id, from a stream of its own (common random
  numbers again: it changes no latency or failure draw), and holds for every
  attempt of the prompt. The real controller applies the filter, so a filtered
  group costs its generation and is replaced exactly as in a run.
* **Pressure** (what ``autopilot.mode: aimd`` reads where vLLM reports its
  KV-cache usage): the slots in use, the groups waiting for one, and the
  fraction of slots in use as the KV-cache usage. Nothing is preempted.
* **Abort** takes ``abort_s`` (the engine call, awaited by the train pump),
  then wakes each group's latency wait and frees its slot; the partial slot
  time counts as busy (the compute was spent, then wasted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from typing import Any

from asyncrl.engines.capabilities import EnginePressure
from asyncrl.errors import ConfigError
from asyncrl.sim.latency import LatencyModel, Work
from asyncrl.sim.sharing import SharedDecoder
from asyncrl.sim.slots import SlotPool
from asyncrl.sim.streams import Stream, component_rng, uniforms
from asyncrl.sim.task import SimSource, SimTask
from asyncrl.sim.tokens import CompletionFactory
from asyncrl.sim.trainer import SimTrainer
from asyncrl.types import (
    GenerationError,
    GenerationRequest,
    GroupAborted,
    GroupId,
    GroupResult,
)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class _Run:
    """One attempt of a group at the fleet: the future its generation waits on,
    and once it holds a slot (``t0`` set) what it generates; either its timer
    (None while generation is paused) with its deadline (while paused: the
    seconds it has left), or - decoding on a shared fleet - its join number."""

    __slots__ = ("a0", "deadline", "fail", "fut", "held", "joined", "request", "since", "t0",
                 "timer", "work")

    def __init__(self, fut: asyncio.Future[None], request: GenerationRequest) -> None:
        self.fut = fut
        self.request = request
        #: When it took its slot (loop time); None while it waits for one.
        self.t0: float | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.deadline = 0.0
        self.joined: int | None = None


class SimEngine:
    """A fleet of ``rollout_slots`` generation slots with sampled latencies.

    Implements :class:`asyncrl.engines.RolloutEngine`. Besides the protocol it
    keeps the numbers the simulator reports: busy slot-seconds, attempts,
    failures, aborts and (``record_intervals``) each slot occupancy interval.
    """

    def __init__(
        self,
        latency: LatencyModel,
        *,
        rollout_slots: int,
        seed: int = 0,
        failure_rate: float = 0.0,
        filter_rate: float = 0.0,
        weight_sync_s: float = 0.0,
        record_intervals: bool = True,
        tokens_per_s: float = 20.0,
        pause_during_sync: bool = False,
        abort_s: float = 0.0,
        phases: Sequence[tuple[int, LatencyModel]] = (),
        fleet: Sequence[tuple[float, int]] = (),
    ) -> None:
        if rollout_slots < 1:
            raise ValueError(f"rollout_slots must be >= 1, got {rollout_slots}")
        if not 0.0 <= failure_rate < 1.0:
            raise ValueError(f"failure_rate must be in [0, 1), got {failure_rate}")
        if not 0.0 <= filter_rate < 1.0:
            raise ValueError(f"filter_rate must be in [0, 1), got {filter_rate}")
        self.latency = latency
        self.rollout_slots = rollout_slots
        self.failure_rate = failure_rate
        self.filter_rate = filter_rate
        self.weight_sync_s = weight_sync_s
        self.tokens_per_s = tokens_per_s
        self.pause_during_sync = pause_during_sync
        self.abort_s = abort_s
        self._version = 0
        #: (active time, version) of every weight update, in order: splits the
        #: tokens of the groups generating when it lands.
        self._updates: list[tuple[float, int]] = []
        #: Seconds generation stood still for syncs so far, and since when it
        #: stands still now (None: it runs); see :meth:`_active`.
        self._paused_s = 0.0
        self._pause_start: float | None = None
        self._slots: SlotPool[_Run] = SlotPool(rollout_slots, self._start_queued)
        #: The fleet schedule, (virtual second, slots) by time: see schedule_fleet.
        self.fleet = list(fleet)
        #: Called with the new slot count after each change (the controller's
        #: fleet-change hook, so derived facts are re-checked).
        self.on_resize: list[Any] = []
        self._first = Stream(component_rng(seed, "latency"), latency.draw)
        self._retry = Stream(component_rng(seed, "latency-retry"), latency.draw)
        #: Workload phases: from weight version ``at``, the model and its streams
        #: (seeded per phase, so prompt k's draw in a phase does not depend on others).
        self._phases = [(at, model,
                         Stream(component_rng(seed, f"latency-phase{at}"), model.draw),
                         Stream(component_rng(seed, f"latency-retry-phase{at}"), model.draw))
                        for at, model in phases]
        #: _phase() of the version held, kept current as the version moves (read per group).
        self._phase_now = self._phase()
        self._retries_drawn = 0
        self._first_coin = Stream(component_rng(seed, "failure"), uniforms)
        self._retry_coin = component_rng(seed, "failure-retry").random
        #: Whether prompt k's groups come back flat (all rewards equal): the k-th
        #: draw; prompts without a numeric id draw in the order they come.
        self._flat_coin = Stream(component_rng(seed, "filter"), uniforms)
        self._flat_other = component_rng(seed, "filter-other").random
        self._running: dict[GroupId, _Run] = {}
        #: Groups generating when the simulation started (start_from): seconds left, latency.
        self._left: dict[GroupId, tuple[float, float]] = {}
        #: Load-dependent latency: the fleet decodes as one shared engine.
        self._decoder = (SharedDecoder(latency.seconds_per_token)
                         if latency.load_dependent else None)
        self._queued: set[GroupId] = set()
        self._abort_queued: set[GroupId] = set()
        self._completions = CompletionFactory()
        self._rewards: dict[int, list[float]] = {}
        self._flat_rewards: dict[int, list[float]] = {}
        self.record_intervals = record_intervals
        #: (start, end, outcome) per slot occupancy; outcome ok / failed / aborted.
        #: ``aborts`` counts attempts stopped while they held a slot.
        self.intervals: list[tuple[float, float, str]] = []
        self.busy_slot_s = 0.0
        self.attempts = 0
        self.failures = 0
        #: Groups generated with all rewards equal (``filter_rate``).
        self.flat_groups = 0
        self.aborts = 0
        self.syncs = 0
        self._busy_now = 0
        self.max_busy = 0

    # ------------------------------------------------------------- protocol
    @property
    def weight_version(self) -> int:
        return self._version

    async def generate(self, request: GenerationRequest) -> GroupResult:
        gid = request.group_id
        loop = asyncio.get_running_loop()
        run = _Run(loop.create_future(), request)
        slots = self._slots
        if slots.try_take():
            try:
                self._start(run, loop)
            except BaseException:
                slots.give_back()  # it never started: the slot is not its
                raise
        else:  # a freed slot starts it (_start_queued): the task wakes when it is done
            self._queued.add(gid)
            slots.wait(run)
        try:
            await run.fut
            if self._decoder is not None:
                run.fut = loop.create_future()
                run.joined, run.a0 = self._decoder.join(loop, run.fut, run.work.longest)
                work = run.work
                run.work = Work(work.latency, 0.0, 1.0, work.longest, work.mean)  # clock: tokens
                await run.fut
        except BaseException:
            if run.t0 is None:  # left while it waited (an abort's run never starts)
                run.fut.cancel()  # done: the slot passes it by (a closed coroutine's was not)
                self._queued.discard(gid)
                self._abort_queued.discard(gid)
                raise
            # Aborted (GroupAborted from abort()) or cancelled by the controller:
            # the timer must not fire into a dead future.
            if run.timer is not None:
                run.timer.cancel()
            if run.joined is not None and run.fut.cancelled():
                self._decoder.leave(loop, run.joined)  # type: ignore[union-attr]
            self.aborts += 1
            self._finish(run, loop, "aborted")
            raise
        fail = run.fail
        self._finish(run, loop, "failed" if fail else "ok")
        if fail:
            self.failures += 1
            raise GenerationError(f"simulated failure of group {gid!r} (attempt {request.attempt})")
        # The controller's start weight, else a pinned version (deterministic
        # mode pins the version a group is generated with), else the one held.
        pinned = request.weight_version
        start_version = request.start_weight
        if start_version is None:
            start_version = run.held if pinned is None else pinned
        held, since = run.held, run.since
        if pinned is not None:  # deterministic mode: every token of the pinned version
            held, since = pinned, len(self._updates)
        updates = self._updates
        # One cheap branch when filter_rate is 0: the hot path stays as it was.
        flat = self.filter_rate > 0 and self.is_flat(request.prompt.prompt_id)
        return self._result(gid, request.num_generations, start_version,
                            run.work, run.a0, held, updates[since:] if since < len(updates) else (),
                            flat)

    def _start_queued(self, run: _Run) -> bool:
        """A freed slot is handed to ``run``, which waited for one: start it, or
        pass (False) when it is gone (cancelled, or aborted while it waited)."""
        if run.fut.done():  # cancelled: its generate call has left the queue
            return False
        gid = run.request.group_id
        self._queued.discard(gid)
        if gid in self._abort_queued:
            self._abort_queued.discard(gid)
            run.fut.set_exception(GroupAborted(gid))
            return False
        try:
            self._start(run, asyncio.get_running_loop())
        except Exception as exc:
            # Raised to its own generate call, not to the caller that freed the
            # slot (another group's end, or a fleet resize); the slot goes on.
            run.fut.set_exception(exc)
            return False
        return True

    def _start(self, run: _Run, loop: asyncio.AbstractEventLoop) -> None:
        """``run`` takes its slot now: draw its latency and failure, note the
        weights it starts with and arm its timer."""
        request = run.request
        gid = request.group_id
        model, first, retry = self._phase_now
        sample, run.fail = self._draw(request, first, retry)
        work = model.work(sample, self._busy_now + 1, self.tokens_per_s)
        if self._left and gid in self._left:  # generating already: see start_from
            left, whole = self._left.pop(gid)
            longest = model.work(whole, 1, self.tokens_per_s).longest
            work = Work(left, 0.0, left / longest, longest, float(longest))
        run.work = work
        # The version held at the start and the updates seen so far (see generate).
        run.held, run.since = self._version, len(self._updates)
        t0 = run.t0 = loop.time()
        self._running[gid] = run
        if self._pause_start is None:
            run.a0 = t0 - self._paused_s
            # A shared fleet: the timer covers base_s, then the group decodes.
            run.deadline = t0 + (work.base_s if self._decoder is not None else work.latency)
            run.timer = loop.call_at(run.deadline, _wake, run.fut)
        else:  # it starts when generation resumes
            run.a0 = self._active(t0)
            self._start_timer(loop, run, work.base_s if self._decoder is not None
                              else work.latency)
        self.attempts += 1
        busy = self._busy_now = self._busy_now + 1
        if busy > self.max_busy:
            self.max_busy = busy

    def _finish(self, run: _Run, loop: asyncio.AbstractEventLoop, outcome: str) -> None:
        """``run``'s slot time is over (ok / failed / aborted): count it, hand the slot on."""
        del self._running[run.request.group_id]
        self._busy_now -= 1
        t1 = loop.time()
        t0 = run.t0
        self.busy_slot_s += t1 - t0  # type: ignore[operator]
        if self.record_intervals:
            self.intervals.append((t0, t1, outcome))  # type: ignore[arg-type]
        self._slots.give_back()

    def start_from(self, version: int, left: dict[GroupId, tuple[float, float]]) -> None:
        """Before the run, for a simulation that starts from a run's state
        (:mod:`asyncrl.sim.seed`): the fleet holds weight ``version``, and the
        groups in ``left`` were generating already: the next attempt of each
        takes ``(seconds left, whole latency)``: its slot for the seconds left,
        the tokens of the whole latency (their versions start at ``version``).
        Time-based latency models only (a shared fleet's decode is not resumed)."""
        if self.latency.load_dependent:
            raise ConfigError("a simulation from a run's state needs a time-based latency "
                              "model (the planner's is one), not distribution: tokens")
        self._version = version
        self._phase_now = self._phase()
        self._left = dict(left)

    async def update_weights(self, weights: Any, version: int) -> None:
        loop = asyncio.get_running_loop()
        pause = self.pause_during_sync and self._pause_start is None
        if pause:
            self._pause(loop.time())
        try:
            if self.weight_sync_s > 0:
                await asyncio.sleep(self.weight_sync_s)
        finally:
            if pause:
                self._resume(loop)
        self.syncs += 1
        self._version = version
        self._phase_now = self._phase()
        now = loop.time()
        clock = self._decoder.service(now) if self._decoder is not None else self._active(now)
        self._updates.append((clock, version))

    def schedule_fleet(self) -> None:
        """Arm one loop timer per fleet change (call inside the running loop,
        before the run starts): the slot count changes at exactly its time."""
        loop = asyncio.get_running_loop()
        for at_s, slots in self.fleet:
            loop.call_at(at_s, self.resize, slots)

    def resize(self, slots: int) -> None:
        """The fleet has ``slots`` slots from now on; a shrink drains (a removed
        slot finishes its group first), as ``asyncrl fleet remove`` does."""
        self._slots.resize(slots)
        self.rollout_slots = slots
        for hook in self.on_resize:
            hook(slots)

    def _start_timer(self, loop: asyncio.AbstractEventLoop, run: _Run, seconds: float) -> None:
        if self._pause_start is None:
            run.deadline = loop.time() + seconds
            run.timer = loop.call_at(run.deadline, _wake, run.fut)
        else:  # starts when generation resumes
            run.deadline = seconds

    def _active(self, now: float) -> float:
        """The active clock: seconds generation has been running (not paused)."""
        paused = self._paused_s
        if self._pause_start is not None:
            paused += now - self._pause_start
        return now - paused

    def _pause(self, now: float) -> None:
        """Stop every running group's clock: keep the work it has left."""
        self._pause_start = now
        if self._decoder is not None:
            self._decoder.pause(now)
        for run in self._running.values():
            if run.timer is not None:
                run.timer.cancel()
                run.timer, run.deadline = None, max(run.deadline - now, 0.0)

    def _resume(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        assert self._pause_start is not None
        self._paused_s += now - self._pause_start
        self._pause_start = None
        if self._decoder is not None:
            self._decoder.resume(loop)
        for run in self._running.values():
            if run.timer is None and run.joined is None and not run.fut.done():
                run.deadline += now
                run.timer = loop.call_at(run.deadline, _wake, run.fut)

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        if group_ids and self.abort_s > 0:
            await asyncio.sleep(self.abort_s)  # the call; the groups stop when it is done
        for gid in group_ids:
            run = self._running.get(gid)
            if run is not None and not run.fut.done():
                if run.timer is not None:
                    run.timer.cancel()
                if run.joined is not None:
                    self._decoder.leave(asyncio.get_running_loop(), run.joined)  # type: ignore[union-attr]
                run.fut.set_exception(GroupAborted(gid))
            elif gid in self._queued:
                self._abort_queued.add(gid)

    async def invalidate_cache(self) -> None:
        return None

    async def pressure(self) -> EnginePressure:
        """The fleet's load, counted in groups: slots in use (running), groups
        queued for a slot (waiting), and as the KV-cache usage a proxy - the
        fraction of the slots in use (a full batch is a full cache). The
        simulated fleet never preempts."""
        busy = self._busy_now
        return EnginePressure(busy, len(self._queued), min(1.0, busy / self.rollout_slots), 0)

    async def retain_weight_versions(self, versions: Collection[int]) -> None:
        """Deterministic mode: simulated weights cost nothing to keep, so every
        pinned version stays available."""
        return None

    async def close(self) -> None:
        return None

    # ------------------------------------------------------------- internals
    def _phase(self) -> tuple[LatencyModel, Stream, Stream]:
        """The latency model (and its streams) of the phase the held version is in."""
        for at, model, first, retry in reversed(self._phases):
            if self._version >= at:
                return model, first, retry
        return self.latency, self._first, self._retry

    def _draw(self, request: GenerationRequest, first: Stream | None = None,
              retry: Stream | None = None) -> tuple[Any, bool]:
        """Latency sample and failure of this attempt (see the module docstring),
        from the streams of the phase (default: the base workload's)."""
        first, retry = first or self._first, retry or self._retry
        key = request.prompt.prompt_id
        p = self.failure_rate
        if request.attempt == 1 and isinstance(key, int) and key >= 0:
            latency = first.at(key)
            fail = p > 0 and self._first_coin.at(key) < p
        else:
            latency = retry.at(self._retries_drawn)
            self._retries_drawn += 1
            fail = p > 0 and self._retry_coin() < p
        return latency, fail

    def is_flat(self, prompt_id: Any) -> bool:
        """Whether prompt ``prompt_id``'s groups come back with all rewards equal
        (drawn once per numeric prompt id, whatever the attempt or the order)."""
        p = self.filter_rate
        if isinstance(prompt_id, int) and prompt_id >= 0:
            return self._flat_coin.at(prompt_id) < p
        return self._flat_other() < p

    def first_attempt_latency(self, prompt_id: int) -> float:
        """The latency the first attempt of prompt ``prompt_id`` takes (or would
        take) with the fleet otherwise idle (the time-based models ignore the load)."""
        return self.latency.work(self._first.at(prompt_id), 1, self.tokens_per_s).latency

    def _result(self, gid: GroupId, n: int, start_version: int, work: Work, a0: float,
                held: int, updates: Sequence[tuple[float, int]], flat: bool) -> GroupResult:
        """The group's ``n`` completions, generated over ``work`` from active time
        ``a0`` with version ``held`` and then the ``updates`` that landed meanwhile;
        its rewards all equal (``flat``) or not. The rewards lists are shared:
        nothing downstream mutates them, and allocating a fresh one per group is
        measurable at 64k groups."""
        completions = self._completions.group(n, work, a0, held, updates)
        if flat:
            self.flat_groups += 1
            rewards = self._flat_rewards.get(n)
            if rewards is None:
                rewards = self._flat_rewards[n] = [0.0] * n
        else:
            rewards = self._rewards.get(n)
            if rewards is None:  # one right answer: the group has signal (n >= 2)
                rewards = self._rewards[n] = [1.0] + [0.0] * (n - 1)
        return GroupResult(gid, [0], completions, start_version, rewards)


__all__ = ["SimEngine", "SimSource", "SimTask", "SimTrainer", "component_rng"]
