"""The dispatcher: the rollout side of the controller.

Two small loops share one queue of :class:`~asyncrl.controller.entry.Entry`:

* the **admitter** asks the sampler to ``admit`` the next dispatch batch once
  the previous batch has left the queue, then queues the batch's prompts;
* the **placer** takes the head of the queue, waits for an in-flight permit
  (``async_rl.max_inflight_prompts``) and a buffer slot, reserves the slot and
  starts the group's task (an :class:`~asyncrl.controller.attempts.AttemptRunner`).

Replacements of dropped groups (:mod:`asyncrl.controller.drops`) and of
filtered ones (:mod:`asyncrl.controller.dynamic_sampling`) go to the front of
the queue; groups in flight at a checkpoint come back there on resume
(:mod:`asyncrl.controller.checkpoint_state`), with the tokens they had then
(:mod:`asyncrl.controller.partials`), and continue from them. A simulation
that starts from a running job's state (the autopilot's planner) hands over
the groups generating there instead, with their slots: :meth:`Dispatcher.adopt`.
Every prompt is in exactly one explicit state, so the train pump can ask
:meth:`Dispatcher.starved` — "can any group become ready before I act?" —
from that state alone.
"""

from __future__ import annotations

import collections
import enum
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from asyncrl._util.change_signal import ChangeSignal
from asyncrl._util.compat import TaskGroup
from asyncrl.controller.attempts import AttemptRunner, Exhausted, Fatal
from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import NoDeterminism
from asyncrl.controller.dynamic_sampling import settle_owed
from asyncrl.controller.entry import Entry, EntryState
from asyncrl.controller.lookahead import Lookahead
from asyncrl.controller.validation import groups_per_batch
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import DynamicSamplingBudgetExceeded, TooManyFailedGroups
from asyncrl.tasks.base import PromptSource, Scorer
from asyncrl.types import GroupId, Prompt, Rollout

log = logging.getLogger("asyncrl.controller")


class AdmitState(enum.Enum):
    RUNNING = "running"  # between two waits
    DRAINING = "draining"  # the last admitted batch still has prompts in the queue
    ADMITTING = "admitting"  # inside sampler.admit, waiting for the gate
    EXHAUSTED = "exhausted"  # the prompt source is dry: nothing more to admit


class Dispatcher:
    def __init__(
        self,
        ctx: RunContext,
        source: PromptSource,
        engines: Sequence[RolloutEngine],
        scorer: Scorer,
        determinism: NoDeterminism,
    ) -> None:
        self.ctx = ctx
        self.source = Lookahead(source)
        self.determinism = determinism
        self.attempts = AttemptRunner(ctx, engines, scorer, determinism, self._set_state)
        self.queue: collections.deque[Entry] = collections.deque()
        #: Reserved groups not yet committed or ended, in dispatch order.
        self.active: dict[GroupId, Entry] = {}
        self.admit_state = AdmitState.RUNNING
        self.placer_idle = False
        #: Dispatch batches admitted so far (the next one's index ``d``).
        self.admitted = 0
        self.next_group = 0
        #: Groups in a working state, and those holding an in-flight permit.
        self.working = 0
        self.inflight = 0
        #: The in-flight bound; re-tuned by :meth:`set_max_inflight`.
        self.max_inflight = ctx.cfg.max_inflight_prompts
        #: Prompts of the last admitted batch still queued.
        self.batch_left = 0
        #: The in-flight groups' start weights, counted (the weight sync's aborts read it).
        self.inflight_weights: collections.Counter[int] = collections.Counter()
        self._queue_changed = ChangeSignal()
        self._permit_freed = ChangeSignal()
        self._tg: TaskGroup | None = None
        #: The admitter and placer tasks of the run (the controller sets them).
        self.loops: list[Any] = []
        ctx.version.on_block = self._blocked

    # ================================================================ loops
    async def run_admitter(self) -> None:
        """Admit dispatch batches until the prompt source runs dry."""
        ctx = self.ctx
        n = groups_per_batch(ctx.sampler, ctx.grpo)  # over-sampled: more than a step needs
        while True:
            while self.batch_left:
                self.admit_state = AdmitState.DRAINING
                self._blocked()
                await self._queue_changed.wait()
            if self.source.peek() is None and not ctx.drops.spares:
                self.admit_state = AdmitState.EXHAUSTED
                self._blocked()
                return
            self.admit_state = AdmitState.ADMITTING
            try:
                stamp = await ctx.sampler.admit(trainer_version=ctx.version)
            except Exception as exc:  # a bug in the sampler: stop with a checkpoint
                ctx.sampler_failed("admit", exc)
                return
            pin = self.determinism.pin(self.admitted)
            self.admitted += 1
            self.admit_state = AdmitState.RUNNING
            batch_index = self.admitted - 1
            for _ in range(n):
                # The task's prompts, then - once those run out - the spare pool's
                # (drawn for replacements, they would otherwise never train).
                prompt = self.source.pop()
                if prompt is None and (prompt := ctx.drops.release_spare()) is None:
                    break
                self.queue.append(Entry(prompt, stamp, pin, batch=True, batch_index=batch_index))
                self.batch_left += 1
            self._queue_changed.fire()

    async def run_placer(self, tg: TaskGroup) -> None:
        """Give the head of the queue a permit and a slot, then start it; forever."""
        self._tg = tg
        for entry in self.active.values():  # adopted before the run (see adopt)
            if entry.task is None:
                entry.task = tg.create_task(self._group(entry),
                                            name=f"asyncrl-gen-{entry.group_id}")
        buffer = self.ctx.buffer
        while True:
            if not self.queue:
                self.placer_idle = True
                self._blocked()
                await self._queue_changed.wait()
                self.placer_idle = False
                continue
            entry = self.queue[0]
            if entry.owed and (over := settle_owed(self.ctx.dynamic, entry)) is not None:
                self.ctx.fail(over)  # still past the budget: it stays queued, the run stops
                return
            if self.inflight >= self.max_inflight:  # read live: a re-tune may move it
                self._set_state(entry, EntryState.AWAIT_INFLIGHT)
                await self._permit_freed.wait()
                continue
            if buffer.is_full():
                self._set_state(entry, EntryState.AWAIT_BUFFER)
                self._blocked()
                await buffer.wait_for_space()
                continue
            self.queue.popleft()
            if entry.batch:
                self.batch_left -= 1
                if not self.batch_left:
                    self._queue_changed.fire()  # the admitter may admit the next batch
            self._reserve(entry)

    def adopt(self, entries: Iterable[Entry]) -> None:
        """Before the run: groups that were generating when a run's state was
        taken (the planner's simulation starts from it: :mod:`asyncrl.sim.seed`),
        each with its buffer slot reserved and its ledger record live already.
        Each holds a permit from now on whatever the bound (it held one in that
        run, and a shrink aborts nothing); its attempt starts with the placer."""
        for entry in entries:
            self.active[entry.group_id] = entry
            self._set_state(entry, EntryState.GENERATING, 0.0)  # (stats start their clock later)

    def set_max_inflight(self, bound: int) -> None:
        """Re-tune the in-flight bound. No group is aborted: after a shrink no
        permit is given until fewer than ``bound`` groups are in flight; a raise
        wakes a placer waiting for a permit."""
        grew = bound > self.max_inflight
        self.max_inflight = bound
        if grew:
            self._permit_freed.fire()

    def cancel(self) -> None:
        """End of the run: stop every group's task; reserved groups stay pending."""
        for entry in self.active.values():
            if entry.task is not None:
                entry.stopping = True
                entry.task.cancel()

    # ========================================================== transitions
    def _set_state(self, entry: Entry, new: EntryState, now: float | None = None) -> None:
        """Move ``entry`` to ``new``, keeping the working and in-flight counts and
        the in-flight weight index exact (the starvation check reads them).
        ``now``: the clock reading of the caller's transition, if it has one
        (one reading per transition, not one per record it updates)."""
        old = entry.state
        if old.working != new.working:
            self.working += 1 if new.working else -1
        if old.inflight != new.inflight:
            w = entry.start_weight
            weights = self.inflight_weights
            if old.inflight:
                left = weights[w] - 1
                if left:
                    weights[w] = left
                else:
                    del weights[w]
                self.inflight -= 1
                self._permit_freed.fire()
            else:
                weights[w] = weights.get(w, 0) + 1
                self.inflight += 1
            self.ctx.stats.inflight_changed(self.ctx.now() if now is None else now, self.inflight)
        entry.state = new

    def _reserve(self, entry: Entry) -> None:
        ctx = self.ctx
        gid = entry.group_id
        fresh = gid is None  # a new group: the ledger has no record of it yet
        if fresh:
            gid = entry.group_id = self.next_group
            self.next_group += 1
        # The group's one start weight: the trainer version now (the engines hold
        # at least it), the pinned one, or - for a group continuing its tokens -
        # the start weight it had when they began.
        if entry.prefix is not None:
            start = entry.prefix.start_weight
        else:
            start = ctx.version.value if entry.pin is None else entry.pin
        ctx.buffer.reserve_nowait(gid, start_weight=start, target_step=entry.stamp)
        now = ctx.now()
        if not fresh and gid in ctx.ledger:
            ctx.ledger[gid].start_weight = start  # a group resumed while in flight
        else:
            ctx.ledger.dispatch(gid, prompt_id=entry.prompt.prompt_id, target_step=entry.stamp,
                                start_weight=start, time=now)
        entry.start_weight = start
        self.active[gid] = entry
        if self.determinism.enabled:
            self.determinism.reserved(gid)
        ctx.stats.buffer_size(len(ctx.buffer))
        self._set_state(entry, EntryState.GENERATING, now)
        assert self._tg is not None
        entry.task = self._tg.create_task(self._group(entry), name=f"asyncrl-gen-{gid}")

    async def _group(self, entry: Entry) -> None:
        outcome = await self.attempts.run(entry)
        if outcome is None:  # aborted: the weight sync did the accounting
            return
        if isinstance(outcome, Fatal):
            # The group stays in flight (pending): the checkpoint keeps it and a
            # resume, after the fix, tries it again.
            self.ctx.fail(outcome.error, key=outcome.key, group=entry.group_id)
            return
        if isinstance(outcome, Exhausted):
            self._give_up(entry, outcome)
            return
        if not self.determinism.enabled:  # commits in any order: this one now
            self.commit_all([(entry, outcome)])
            return
        ready = self.determinism.finished(entry.group_id, (entry, outcome))
        for e, _ in ready:
            if e is entry:
                break
        else:  # an earlier group has not finished: wait for it
            self._set_state(entry, EntryState.COMMIT_WAIT)
        self.commit_all(ready)

    def commit_all(self, ready: list[tuple[Entry, Rollout]]) -> None:
        """Commit finished groups, at one time (those the dynamic-sampling filter keeps)."""
        if not ready:
            return
        ctx = self.ctx
        now = ctx.now()  # the groups commit together, at one time
        dynamic = ctx.dynamic  # None with filter: none; then the check costs no call
        for entry, rollout in ready:
            gid = entry.group_id
            # The result's end weight (>= start_weight), found when the attempt checked it.
            end = entry.end_weight
            if dynamic is not None and not self._passes_filter(entry, rollout, now):
                continue
            ctx.buffer.commit(gid, rollout, end_weight=end)
            ctx.ledger.committed(gid, end_weight=end, attempts=rollout.attempts, time=now)
            ctx.drops.committed()
            if entry.prefix is not None and entry.continues:  # a resumed group only
                ctx.stats.groups_continued += 1
            # No buffer_size here: a commit turns a reserved slot ready, the
            # number of slots (what max_buffer_seen tracks) stays the same.
            self.leave(entry, now)
        ctx.progress(now)

    def _passes_filter(self, entry: Entry, rollout: Rollout, now: float) -> bool:
        """``grpo.dynamic_sampling``: True to commit the group; else it is recorded
        ``filtered``, its slot freed and, when its batch needs it, replaced."""
        ctx = self.ctx
        dynamic = ctx.dynamic
        assert dynamic is not None
        gid = entry.group_id
        try:
            reason = dynamic.filter.reject(rollout)
        except Exception as exc:
            # The group stays in flight (pending), as with any bug in a component:
            # the checkpoint keeps it and a resume, after the fix, scores it again.
            ctx.fail(dynamic.filter_bug(exc, gid), key="grpo.dynamic_sampling.filter", group=gid)
            return False
        if reason is None:
            dynamic.kept()
            return True
        ctx.buffer.release(gid)  # a filtered group holds no slot
        ctx.ledger.filtered(gid, attempts=rollout.attempts, time=now,
                            end_weight=entry.end_weight, reason=reason)
        ctx.drops.committed()  # it was generated and scored: an infra outage is over
        self.leave(entry, now)
        due = dynamic.filtered(entry, reason, assembling=ctx.assembling)
        replacement = ctx.drops.replacement(entry, self._draw, charged=False) if due else None
        if replacement is not None:
            # Past the budget it is owed: it stays queued, for the resumed run to generate.
            over = dynamic.replaced(entry.batch_index)
            replacement.owed = over is not None
            self.queue.appendleft(replacement)
            self._queue_changed.fire()
            if over is not None and not any(
                    isinstance(e, DynamicSamplingBudgetExceeded) for e in ctx.fatal):
                ctx.fail(over)  # reported once, however many groups hit it meanwhile
        return False

    def leave(self, entry: Entry, now: float | None = None) -> None:
        """``entry`` is done here (its slot and ledger record are the caller's to settle)."""
        self._set_state(entry, EntryState.LEFT, now)
        del self.active[entry.group_id]

    def _give_up(self, entry: Entry, exhausted: Exhausted) -> None:
        """A budget ran out: replace the group or shrink its step
        (:class:`~asyncrl.controller.drops.DropPolicy`), and record ``failed``.
        A group that would use a failure budget up stops the run instead."""
        ctx = self.ctx
        gid, error = entry.group_id, exhausted.error
        try:
            replacement = ctx.drops.drop(entry, exhausted.kind, error, step=ctx.assembling,
                                         draw=self._draw)
        except TooManyFailedGroups as exc:
            # Not dropped: the group stays pending (in flight, as a bug's group
            # does), the checkpoint keeps it, and the run resumed after the fix
            # tries it again with a fresh budget - its step waits for it, where a
            # group failed for good would leave the step short. Groups still in
            # flight when a budget ran out may use it up again before the run
            # stops: that is the same failure, reported once.
            if exhausted.kind == "data":
                entry.data_failures = 0
            else:
                entry.infra_failures = 0
            if not any(isinstance(e, TooManyFailedGroups) for e in ctx.fatal):
                ctx.fail(exc)
            return
        ctx.buffer.release(gid)
        now = ctx.now()
        ctx.ledger.failed(gid, attempts=entry.attempts, time=now, error=repr(error),
                          kind=exhausted.kind)
        self.leave(entry, now)
        self.commit_all(self.determinism.dropped(gid))
        ctx.stats.group_failed()
        ctx.failures.warn("failed for good", exhausted.key, gid,
                          "group %s failed for good (%s budget, %d attempts: %s); %s", gid,
                          exhausted.kind, entry.attempts, error,
                          "replacing its prompt" if replacement is not None
                          else "its step shrinks")
        if replacement is not None:
            self.queue.appendleft(replacement)
            self._queue_changed.fire()
        else:
            ctx.buffer.notify()  # the train pump's step may need fewer groups now

    def _draw(self, count: int) -> list[Prompt]:
        """Up to ``count`` prompts from the task, for the spare pool."""
        out = []
        while len(out) < count and (prompt := self.source.pop()) is not None:
            out.append(prompt)
        return out

    # ============================================================== queries
    def _blocked(self) -> None:
        """A loop of ours just blocked: wake the train pump if it is deciding
        whether anything more can arrive (see :meth:`starved`)."""
        if self.ctx.train_waiting:
            self.ctx.buffer.notify()

    def starved(self) -> bool:
        """True when no group can become ready until the train pump acts: nothing
        is working, the placer waits on a full buffer (or has nothing to place),
        and the admitter waits on the trainer version, on the queue, or is done.
        Each blocked state is checked against the condition it waits on, so a
        loop that was woken but has not run yet counts as runnable."""
        if self.working:
            return False
        if self.queue:
            if self.queue[0].state is not EntryState.AWAIT_BUFFER or not self.ctx.buffer.is_full():
                return False
        elif not self.placer_idle:
            return False
        state = self.admit_state
        if state is AdmitState.EXHAUSTED:
            return True
        if state is AdmitState.DRAINING:
            return self.batch_left > 0
        if state is AdmitState.ADMITTING:
            return self.ctx.version.waiters_blocked()
        return False

    def exhausted(self) -> bool:
        """True when nothing more can ever reach the buffer."""
        return self.admit_state is AdmitState.EXHAUSTED and not self.queue and not self.active

    def stop_dispatching(self) -> None:
        """A fatal error: no queued prompt gets a slot any more (the loops are
        cancelled; the prompts stay queued, in the checkpoint)."""
        for loop in self.loops:
            loop.cancel()

    def undispatched(self) -> dict[str, list[int]]:
        """Prompts read from the task that no group holds yet, by where they wait:
        admitted but not yet dispatched, in the spare pool, or read ahead."""
        return {"queued": [e.prompt.prompt_id for e in self.queue if e.group_id is None],
                "spare": [p.prompt_id for p in self.ctx.drops.spares],
                "lookahead": [p.prompt_id for p in self.source.held]}

    def queued_groups(self) -> set[GroupId]:
        """Groups the ledger has live that wait in the queue for a slot again
        (a resumed run's in-flight groups, until the placer takes them)."""
        return {e.group_id for e in self.queue if e.group_id is not None}

    def live_pins(self) -> list[int | None]:
        return [e.pin for e in (*self.queue, *self.active.values())]

    def describe(self) -> str:
        head = self.queue[0].state.label if self.queue else "-"
        return (f"admitter {self.admit_state.value}, {len(self.queue)} queued (head {head}), "
                f"{self.inflight} in flight, {self.working} working")
