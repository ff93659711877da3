"""The controller: a rollout pump and a train pump over one buffer and one sampler.

Timing diagram of one training step ``v`` (see docs/controller.md)::

    rollout pump  admit(d) -> reserve -> generate ... commit    admit(d+1) (gate opens)
    train pump    evict -> select -> train_chunk ... finish_step -> sync -> v+1 -> abort/invalidate

Invariants the code below keeps, and the tests check:

* ``TrainerVersion`` advances only after every engine holds the new weights, so a
  batch admitted at version ``v`` is generated with weights ``>= v``;
* every dispatched group has a ledger record that reaches exactly one terminal
  state, or is pending (in the buffer) when the run stops;
* nothing waits by polling: the pumps wait on the sampler's admission gate, the
  buffer's change signal, the in-flight semaphore and the engines' futures.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from asyncrl._compat import BaseExceptionGroup, TaskGroup
from asyncrl._signal import ChangeSignal
from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.config import AsyncRLConfig, GRPOConfig
from asyncrl.controller.ledger import Ledger
from asyncrl.controller.validation import pinned_weight_version, validate_setup
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import (
    BackendLost,
    EngineUnavailable,
    LedgerImbalance,
    RolloutStall,
    TooManyFailedGroups,
)
from asyncrl.metrics import MetricsSink, Timeline
from asyncrl.sampling import PromptGroupSampler, create_sampler
from asyncrl.tasks.base import PromptSource, Task
from asyncrl.trainers.base import Trainer
from asyncrl.types import (
    GenerationRequest,
    GroupAborted,
    GroupId,
    Prompt,
    Rollout,
    prompt_from_dict,
    prompt_to_dict,
    rollout_from_dict,
    rollout_to_dict,
)
from asyncrl.version import TrainerVersion

log = logging.getLogger("asyncrl.controller")

StepHook = Callable[["Controller", int], Awaitable[None]]


@dataclasses.dataclass(eq=False)
class _InFlight:
    group_id: GroupId
    prompt: Prompt
    target_step: int | None
    start_weight: int
    attempts: int = 0
    #: Attempts lost with a dead engine worker: not charged to the failure budget.
    lost: int = 0
    task: asyncio.Task[None] | None = None
    engine: int | None = None
    aborted: bool = False
    gen_start: float = 0.0


@dataclasses.dataclass
class RunResult:
    summary: dict[str, Any]
    steps: int
    stop_reason: str


class _Source:
    """The task's prompt source plus prompts taken from it but not yet dispatched.

    Keeping those prompts here (not in local variables of the pump) lets a
    checkpoint record them, so a resumed run dispatches them instead of losing them.
    """

    def __init__(self, source: PromptSource) -> None:
        self.source = source
        self.held: collections.deque[Prompt] = collections.deque()
        self.exhausted = False

    def peek(self) -> Prompt | None:
        if not self.held and not self.exhausted:
            prompt = self.source.next_prompt()
            if prompt is None:
                self.exhausted = True
            else:
                self.held.append(prompt)
        return self.held[0] if self.held else None

    def pop(self) -> Prompt | None:
        prompt = self.peek()
        if prompt is not None:
            self.held.popleft()
        return prompt

    @property
    def dry(self) -> bool:
        return self.peek() is None


class Controller:
    """Runs async GRPO: see the module docstring and docs/controller.md."""

    def __init__(
        self,
        *,
        task: Task,
        engines: Sequence[RolloutEngine],
        trainer: Trainer,
        grpo: GRPOConfig,
        async_rl: AsyncRLConfig,
        seed: int = 0,
        deterministic: bool = False,
        sinks: Sequence[MetricsSink] = (),
        on_step_end: StepHook | None = None,
        check_invariants: bool = True,
    ) -> None:
        if not engines:
            raise ValueError("Controller needs at least one rollout engine")
        self.task = task
        self.engines = list(engines)
        self.trainer = trainer
        self.grpo = grpo
        self.cfg = async_rl
        self.seed = seed
        self.deterministic = deterministic
        self.sinks = list(sinks)
        self.on_step_end = on_step_end
        self.check_invariants = check_invariants

        self.buffer = RolloutBuffer(async_rl.max_buffered_rollouts)
        self.sampler: PromptGroupSampler = create_sampler(self.buffer, async_rl.sampler)
        validate_setup(self.sampler, grpo, async_rl, deterministic=deterministic)
        self.version = TrainerVersion(0)
        self.ledger = Ledger()
        self.timeline = Timeline()
        self.source = _Source(task.prompt_source(seed))

        self._next_group = 0
        self._inflight: dict[GroupId, _InFlight] = {}
        self._engine_load = [0] * len(self.engines)
        self._slots_free = asyncio.Semaphore(async_rl.max_inflight_prompts)
        self._progress = ChangeSignal()
        self._removed: list[Slot] = []
        self.buffer.add_remove_listener(self._removed.extend)
        self._failed_groups = 0
        self._rollout_done = False
        # Dispatchers (the rollout pump and replacements of failed groups) that are
        # running, and how many of them wait in admit or for buffer space.
        self._dispatchers = 0
        self._parked = 0
        self._awaiting_slot: dict[object, tuple[Prompt, int | None, int | None]] = {}
        self._inflight_weights: collections.Counter[int] = collections.Counter()
        # The current dispatch batch: (stamp, prompts still in the source, pinned
        # weight version), for checkpoints.
        self._open_batch: tuple[int | None, int, int | None] | None = None
        self._resume_inflight: list[_InFlight] = []
        self._resume_awaiting: list[tuple[Prompt, int | None, int | None]] = []
        self._elapsed_before = 0.0  # wall time of the runs this one resumes
        # Deterministic mode: finished groups commit in dispatch order.
        self._commit_order: collections.OrderedDict[GroupId, Any] = collections.OrderedDict()

        self._t0 = 0.0
        self._steps_done = 0
        self._step_metrics: list[dict[str, Any]] = []
        self._staleness_hist: collections.Counter[int] = collections.Counter()
        self._max_inflight_seen = 0
        self._max_buffer_seen = 0
        self._trainer_idle_total = 0.0
        self._busy_area = 0.0
        self._busy_mark = 0.0
        self._busy_area_at_step = 0.0
        self._step_counts = collections.Counter()
        self.stop_reason = "not started"
        self.stop_message = ""
        self._running = False
        self._loop: asyncio.AbstractEventLoop | None = None

    # ================================================================ the run
    def _now(self) -> float:
        loop = self._loop
        return loop.time() if loop is not None else asyncio.get_running_loop().time()

    async def run(self) -> RunResult:
        """Run until ``grpo.max_num_steps`` (or the prompt source runs dry)."""
        self._loop = asyncio.get_running_loop()
        self._t0 = self._now() - self._elapsed_before
        self._busy_mark = self._t0
        self._running = True
        self.stop_reason = "running"
        try:
            async with TaskGroup() as tg:
                rollout = tg.create_task(self._rollout_pump(), name="asyncrl-rollout-pump")
                watchdog = (
                    tg.create_task(self._watchdog(), name="asyncrl-watchdog")
                    if self.cfg.stall_timeout_s
                    else None
                )
                train = tg.create_task(self._train_pump(), name="asyncrl-train-pump")

                def _stop_siblings(t: asyncio.Task[None]) -> None:
                    # The train pump decides when the run is over; the rollout
                    # pump may be parked in admit or reserve and must be told.
                    if not t.cancelled() and t.exception() is None:
                        rollout.cancel()
                        if watchdog is not None:
                            watchdog.cancel()

                train.add_done_callback(_stop_siblings)
        except BaseExceptionGroup as group:
            self.stop_reason = "error"
            raise _first_cause(group) from None
        except asyncio.CancelledError:
            self.stop_reason = "cancelled"
            raise
        finally:
            self._running = False
            await self._shutdown()
        return RunResult(self.summary(), self._steps_done, self.stop_reason)

    async def _shutdown(self) -> None:
        """Stop engines' work on whatever is still in flight; groups stay pending."""
        # By now the pumps' task groups have exited; groups still reserved in the
        # buffer were in flight and stay pending. Tell the engines to drop them.
        live = [s.group_id for s in self.buffer.slots() if not s.ready]
        self._mark_busy()
        for engine in self.engines:
            with _suppress_all():
                if live:
                    await engine.abort(live)
        summary = self.summary()
        for sink in self.sinks:
            with _suppress_all():
                sink.close(summary)
        if self.check_invariants and self.stop_reason != "error":
            ok, why = self.ledger.check_balance({s.group_id for s in self.buffer.slots()})
            if not ok:
                raise LedgerImbalance(f"the ledger does not balance at the end of the run: {why}")

    # ========================================================== rollout pump
    async def _rollout_pump(self) -> None:
        n = self.grpo.num_prompts_per_step
        async with TaskGroup() as gens:
            self._gens = gens
            self._dispatchers += 1
            try:
                # Resumed in-flight groups go first, with their original stamps and
                # attempt counts, and do not pass through admit again.
                # Each stays listed in _resume_* until it is tracked elsewhere, so a
                # checkpoint taken meanwhile records it exactly once.
                while self._resume_inflight:
                    rec = self._resume_inflight[0]
                    await self._dispatch(rec.prompt, rec.target_step, attempts=rec.attempts,
                                         group_id=rec.group_id, pin=self._pin_of(rec))
                    self._resume_inflight.pop(0)
                while self._resume_awaiting:
                    prompt, stamp, pin = self._resume_awaiting.pop(0)
                    await self._dispatch(prompt, stamp, pin=pin)
                if self._open_batch is not None:
                    stamp, left, pin = self._open_batch
                    await self._dispatch_batch(stamp, left, pin)
                while not self.source.dry:
                    self._parked += 1
                    try:
                        stamp = await self.sampler.admit(trainer_version=self.version)
                    finally:
                        self._parked -= 1
                    await self._dispatch_batch(stamp, n, self._batch_pin())
            finally:
                self._dispatchers -= 1
            self._rollout_done = True
            self.buffer.notify()  # the train pump may now conclude that nothing more comes

    def _batch_pin(self) -> int | None:
        """Deterministic mode: the weight version the batch just admitted is
        generated with. Batch ``d`` may go once ``v >= d - s``, so version
        ``max(0, d - s)`` is always available and does not depend on timing."""
        if not self.deterministic:
            return None
        d = self.sampler.dispatch_index - 1  # type: ignore[attr-defined]
        return pinned_weight_version(self.sampler, d)

    def _pin_of(self, rec: _InFlight) -> int | None:
        return rec.start_weight if self.deterministic else None

    async def _dispatch_batch(self, stamp: int | None, count: int, pin: int | None) -> None:
        for left in range(count, 0, -1):
            prompt = self.source.pop()
            if prompt is None:
                break
            # Prompts of this batch still in the source; the popped one is tracked
            # by _awaiting_slot until it has a slot.
            self._open_batch = (stamp, left - 1, pin)
            await self._dispatch(prompt, stamp, pin=pin)
        self._open_batch = None

    async def _dispatch(
        self,
        prompt: Prompt,
        stamp: int | None,
        *,
        attempts: int = 0,
        group_id: GroupId | None = None,
        pin: int | None = None,
    ) -> None:
        """Reserve a slot for ``prompt`` and start generating it.

        Until it has a slot the prompt is listed in ``self._awaiting_slot`` (with
        its stamp), so a checkpoint taken, or a cancellation, while it waits here
        loses nothing.
        """
        token = object()
        if group_id is None:  # a resumed in-flight group is tracked by _resume_inflight
            self._awaiting_slot[token] = (prompt, stamp, pin)
        await self._slots_free.acquire()
        try:
            if group_id is None:
                group_id = self._next_group
                self._next_group += 1
            if self.buffer.is_full():
                self._parked += 1
                try:
                    await self.buffer.wait_for_space()
                finally:
                    self._parked -= 1
            # The weight version is read when the slot is granted: generation starts
            # now (deterministic mode pins it instead, see _batch_pin).
            start = self.version.value if pin is None else pin
            self.buffer.reserve_nowait(group_id, start_weight=start, target_step=stamp)
        except BaseException:
            self._slots_free.release()
            raise
        self._awaiting_slot.pop(token, None)
        now = self._now()
        if group_id in self.ledger:
            self.ledger[group_id].start_weight = start  # a resumed in-flight group
        else:
            self.ledger.dispatch(group_id, prompt_id=prompt.prompt_id, target_step=stamp,
                                 start_weight=start, time=now)
        rec = _InFlight(group_id, prompt, stamp, start, attempts=attempts)
        self._mark_busy()
        self._inflight[group_id] = rec
        self._inflight_weights[start] += 1
        if self.deterministic:
            self._commit_order[group_id] = None
        self._max_inflight_seen = max(self._max_inflight_seen, len(self._inflight))
        self._max_buffer_seen = max(self._max_buffer_seen, len(self.buffer))
        rec.task = self._gens.create_task(self._generate(rec), name=f"asyncrl-gen-{group_id}")

    async def _generate(self, rec: _InFlight) -> None:
        rf = self.cfg.rollout_failure
        try:
            while True:
                rec.attempts += 1
                self.ledger.set_attempts(rec.group_id, rec.attempts)
                engine_idx = self._pick_engine()
                rec.engine = engine_idx
                self._engine_load[engine_idx] += 1
                rec.gen_start = self._now()
                request = GenerationRequest(
                    group_id=rec.group_id,
                    prompt=rec.prompt,
                    num_generations=self.grpo.num_generations_per_prompt,
                    attempt=rec.attempts,
                    seed=self._group_seed(rec.group_id) if self.deterministic else None,
                    weight_version=self._pin_of(rec),
                )
                try:
                    result = await self.engines[engine_idx].generate(request)
                except (asyncio.CancelledError, GroupAborted):
                    if rec.aborted:
                        return
                    raise
                except BackendLost:
                    raise  # no engine is left to retry on: the run fails
                except EngineUnavailable as exc:
                    # The engine's worker died, not the group: retry at once on
                    # another engine, without charging the group's failure budget.
                    self.timeline.add("gen", engine_idx, rec.gen_start, self._now(), "lost")
                    rec.lost += 1
                    log.warning("group %s attempt %d lost with engine %d (%s); retrying",
                                rec.group_id, rec.attempts, engine_idx, exc)
                    continue
                except Exception as exc:
                    self.timeline.add("gen", engine_idx, rec.gen_start, self._now(), "failed")
                    charged = rec.attempts - rec.lost
                    if charged >= rf.max_attempts:
                        await self._give_up(rec, exc)
                        return
                    delay = min(rf.backoff_s * 2 ** (charged - 1), rf.max_backoff_s)
                    log.warning("group %s attempt %d failed (%s); retrying in %.2fs",
                                rec.group_id, rec.attempts, exc, delay)
                    await asyncio.sleep(delay)  # exponential backoff, not a poll
                    continue
                finally:
                    self._engine_load[engine_idx] -= 1
                self.timeline.add("gen", engine_idx, rec.gen_start, self._now(), "ok")
                rewards = result.rewards
                if rewards is None:
                    rewards = [self.task.reward(rec.prompt, text) for text in result.completion_texts]
                rollout = Rollout(rec.group_id, rec.prompt, result, list(rewards),
                                  rec.target_step, rec.attempts)
                if self.deterministic:
                    self._commit_order[rec.group_id] = rollout
                    self._flush_in_order()
                else:
                    self._commit(rollout)
                return
        finally:
            if self._untrack(rec):
                self._mark_busy()
                self._slots_free.release()
                if self.deterministic and rec.aborted:
                    self._commit_order.pop(rec.group_id, None)
                    self._flush_in_order()

    def _pick_engine(self) -> int:
        """The least-loaded engine, skipping engines that report ``healthy = False``
        (a Ray worker being restarted or gone) while any other is healthy."""
        if len(self.engines) == 1:
            return 0
        healthy = [i for i, e in enumerate(self.engines) if getattr(e, "healthy", True)]
        return min(healthy or range(len(self.engines)), key=self._engine_load.__getitem__)

    def _commit(self, rollout: Rollout) -> None:
        gid = rollout.group_id
        end = max(rollout.result.end_weight, self.buffer.get(gid).start_weight)
        self.buffer.commit(gid, rollout, end_weight=end)
        self.ledger.committed(gid, end_weight=end, attempts=rollout.attempts, time=self._now())
        self._max_buffer_seen = max(self._max_buffer_seen, len(self.buffer))
        self._progress.fire()

    def _flush_in_order(self) -> None:
        """Deterministic mode: commit finished groups strictly in dispatch order."""
        while self._commit_order:
            rollout = next(iter(self._commit_order.values()))
            if rollout is None:
                return
            self._commit_order.popitem(last=False)
            self._commit(rollout)

    async def _give_up(self, rec: _InFlight, exc: BaseException) -> None:
        """Retries exhausted: record ``failed`` and replace the prompt, same stamp."""
        self.buffer.release(rec.group_id)
        self.ledger.failed(rec.group_id, attempts=rec.attempts, time=self._now())
        self._step_counts["failed"] += 1
        self._failed_groups += 1
        if self.deterministic:
            self._commit_order.pop(rec.group_id, None)
            self._flush_in_order()
        limit = self.cfg.rollout_failure.max_failed_groups
        if self._failed_groups > limit:
            raise TooManyFailedGroups(
                f"{self._failed_groups} prompt groups failed after "
                f"{self.cfg.rollout_failure.max_attempts} attempts each, more than "
                f"async_rl.rollout_failure.max_failed_groups={limit}. Last error: {exc!r}. "
                "Fix the engine, or raise max_attempts / max_failed_groups"
            ) from exc
        log.warning("group %s failed for good after %d attempts (%s); replacing its prompt",
                    rec.group_id, rec.attempts, exc)
        # Free our in-flight permit before dispatching the replacement.
        self._untrack(rec)
        self._mark_busy()
        self._slots_free.release()
        replacement = self.source.pop()
        if replacement is not None:
            self._dispatchers += 1
            try:
                await self._dispatch(replacement, rec.target_step, pin=self._pin_of(rec))
            finally:
                self._dispatchers -= 1
        else:
            self.buffer.notify()

    def _group_seed(self, group_id: GroupId) -> int:
        digest = hashlib.blake2b(f"{self.seed}:{group_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & 0x7FFF_FFFF

    # ============================================================ train pump
    async def _train_pump(self) -> None:
        n = self.grpo.num_prompts_per_step
        min_chunk = self.cfg.min_groups_for_streaming_train
        while self.version.value < self.grpo.max_num_steps:
            v = self.version.value
            step_start = self._now()
            self._busy_area_at_step = self._busy_area_now()
            idle = 0.0
            remaining = n
            trained: list[tuple[Slot, int]] = []
            chunk_metrics: list[tuple[int, dict[str, float]]] = []
            evicted_here = 0
            while remaining > 0:
                evicted_here += await self._evict(v)
                self._removed.clear()
                chunk = await self.sampler.select(
                    current_train_weight=v,
                    min_prompt_groups=min(min_chunk, remaining),
                    max_prompt_groups=remaining,
                )
                evicted_here += self._account_removed(chunk or [], v)
                if not chunk and await self._starved():
                    # Nothing in flight and the rollout pump cannot dispatch until this
                    # step ends: waiting for a full streaming chunk would wait forever
                    # (e.g. weight_fifo with fewer groups left at the oldest version
                    # than min_groups_for_streaming_train). Take what is eligible.
                    chunk = await self.sampler.select(
                        current_train_weight=v, min_prompt_groups=1, max_prompt_groups=remaining
                    )
                    evicted_here += self._account_removed(chunk or [], v)
                if not chunk:
                    if self._nothing_more_can_come():
                        if remaining == n:
                            self._stop("source_exhausted",
                                       f"the prompt source ran dry after {self._steps_done} steps")
                            return
                        self._stop(
                            "incomplete_step",
                            f"the prompt source ran dry in the middle of step {v}: only "
                            f"{n - remaining} of num_prompts_per_step={n} groups could be "
                            "trained, so the last optimizer step used fewer groups. Give the "
                            "task more prompts (task.num_prompts) or lower grpo.max_num_steps",
                        )
                        break
                    if await self._starved():
                        raise RolloutStall(
                            f"deadlock at step {v}: no group is in flight, the rollout pump "
                            f"cannot dispatch (buffer {len(self.buffer)}/{self.buffer.capacity} "
                            f"slots, {self.buffer.ready_count} ready) and sampler "
                            f"{type(self.sampler).__name__} selects none of the ready groups. "
                            "A custom sampler must evict groups it will never select"
                        )
                    t = self._now()
                    await self.buffer.wait_changed()
                    idle += self._now() - t
                    continue
                if len(chunk) > remaining:
                    raise RuntimeError(
                        f"sampler {type(self.sampler).__name__}.select returned {len(chunk)} "
                        f"groups, more than max_prompt_groups={remaining}"
                    )
                t = self._now()
                metrics = await self.trainer.train_chunk([s.payload for s in chunk], step=v)
                self.timeline.add("train", 0, t, self._now(), str(v))
                chunk_metrics.append((len(chunk), metrics or {}))
                for slot in chunk:
                    staleness = v - slot.start_weight
                    self.ledger.trained(slot.group_id, step=v, staleness=staleness)
                    trained.append((slot, staleness))
                remaining -= len(chunk)
            t = self._now()
            step_metrics = await self.trainer.finish_step(step=v) or {}
            weights = await self.trainer.get_weights()
            await asyncio.gather(*(e.update_weights(weights, v + 1) for e in self.engines))
            self.timeline.add("sync", 0, t, self._now(), str(v))
            self.version.set(v + 1)
            self._steps_done += 1
            aborted = await self._abort_hopeless(v + 1)
            if self.sampler.is_on_policy and self.cfg.recompute_kv_cache_after_weight_updates:
                await asyncio.gather(*(e.invalidate_cache() for e in self.engines))
            self._progress.fire()
            self._emit_step(v, step_start, idle, trained, chunk_metrics, step_metrics,
                            evicted_here, aborted)
            if self.on_step_end is not None:
                await self.on_step_end(self, v + 1)
            if self.stop_reason == "incomplete_step":
                return
        self._stop("max_num_steps", f"reached grpo.max_num_steps={self.grpo.max_num_steps}")

    def _stop(self, reason: str, message: str) -> None:
        self.stop_reason, self.stop_message = reason, message
        log.info("stopping: %s", message)

    async def _starved(self) -> bool:
        """True when no new group can become ready before this step ends."""
        if self._inflight or self._parked < self._dispatchers:
            return False
        # The rollout pump may have just become runnable (a wake-up not yet
        # delivered); give it one turn before concluding it is parked.
        await asyncio.sleep(0)
        return not self._inflight and self._parked == self._dispatchers

    def _nothing_more_can_come(self) -> bool:
        return (self._rollout_done and self._dispatchers == 0 and not self._inflight
                and not self._resume_inflight and not self._resume_awaiting)

    async def _evict(self, v: int) -> int:
        self._removed.clear()
        count = await self.sampler.evict(current_train_weight=v)
        removed = list(self._removed)
        self._removed.clear()
        for slot in removed:
            if slot.ready:
                self.ledger.evicted(slot.group_id, step=v)
        if len(removed) != count:
            log.debug("sampler reported %d evictions, buffer saw %d", count, len(removed))
        return len(removed)

    def _account_removed(self, chunk: list[Slot], v: int) -> int:
        """Slots a select removed but did not return count as evicted."""
        chosen = {id(s) for s in chunk}
        extra = [s for s in self._removed if id(s) not in chosen]
        self._removed.clear()
        for slot in extra:
            self.ledger.evicted(slot.group_id, step=v)
        if self.check_invariants:
            for slot in chunk:
                if not slot.ready:
                    raise RuntimeError(
                        f"sampler {type(self.sampler).__name__} selected unready group "
                        f"{slot.group_id!r}"
                    )
        return len(extra)

    def _untrack(self, rec: _InFlight) -> bool:
        if self._inflight.pop(rec.group_id, None) is None:
            return False
        left = self._inflight_weights[rec.start_weight] - 1
        if left:
            self._inflight_weights[rec.start_weight] = left
        else:
            del self._inflight_weights[rec.start_weight]
        return True

    async def _abort_hopeless(self, v: int) -> int:
        # Ask the sampler once per distinct start weight, not once per group: the
        # per-step cost must not grow with the number of groups in flight.
        doomed = {
            w
            for w in self._inflight_weights
            if self.sampler.should_abort_inflight(start_weight_version=w, current_train_weight=v)
        }
        if not doomed:
            return 0
        hopeless = [r for r in self._inflight.values()
                    if r.start_weight in doomed and not r.aborted]
        if not hopeless:
            return 0
        now = self._now()
        by_engine: dict[int, list[GroupId]] = collections.defaultdict(list)
        for rec in hopeless:
            rec.aborted = True
            self.buffer.release(rec.group_id)
            self.ledger.aborted(rec.group_id, attempts=rec.attempts, time=now)
            if rec.engine is not None:
                by_engine[rec.engine].append(rec.group_id)
                self.timeline.add("gen", rec.engine, rec.gen_start, now, "aborted")
            if rec.task is not None:
                rec.task.cancel()
        for idx, gids in by_engine.items():
            await self.engines[idx].abort(gids)
        return len(hopeless)

    async def _watchdog(self) -> None:
        timeout = self.cfg.stall_timeout_s
        while True:
            try:
                await asyncio.wait_for(self._progress.wait(), timeout)
            except asyncio.TimeoutError:  # the builtin TimeoutError from 3.11 on
                raise RolloutStall(
                    f"no prompt group committed and no training step finished for "
                    f"{timeout}s (async_rl.stall_timeout_s). The train pump is waiting for "
                    f"step {self.version.value}: {self.buffer.ready_count} ready and "
                    f"{len(self._inflight)} in-flight groups, sampler "
                    f"{type(self.sampler).__name__} (dispatch index "
                    f"{getattr(self.sampler, 'dispatch_index', '?')}). Check that the engines "
                    "are alive, or raise stall_timeout_s for slow generation"
                ) from None

    # ========================================================= checkpointing
    def state_dict(self) -> dict[str, Any]:
        """Everything but the trainer's own state needed to resume with nothing lost.

        Meant to be called between steps (``on_step_end``). Ready groups keep
        their payloads and stamps; in-flight groups (including those backing
        off before a retry) keep their prompt, stamp and attempt count; prompts
        taken from the source but not yet given a slot are kept too. Every value
        is plain JSON-able data.
        """
        ready, inflight = [], []
        for slot in self.buffer.slots():
            if slot.ready:
                ready.append({"group_id": slot.group_id, "start_weight": slot.start_weight,
                              "end_weight": slot.end_weight, "target_step": slot.target_step,
                              "dispatch_seq": slot.dispatch_seq,
                              "payload": rollout_to_dict(slot.payload)})
            else:
                rec = self.ledger[slot.group_id]
                pending = self._inflight.get(slot.group_id)
                prompt = pending.prompt if pending is not None else self._finished_prompt(slot)
                inflight.append({"group_id": slot.group_id, "prompt": prompt_to_dict(prompt),
                                 "target_step": slot.target_step, "attempts": rec.attempts,
                                 "start_weight": slot.start_weight})
        inflight += [{"group_id": r.group_id, "prompt": prompt_to_dict(r.prompt),
                      "target_step": r.target_step, "attempts": r.attempts,
                      "start_weight": r.start_weight}
                     for r in self._resume_inflight]
        awaiting = [{"prompt": prompt_to_dict(p), "target_step": stamp, "pin": pin}
                    for p, stamp, pin in (*self._resume_awaiting, *self._awaiting_slot.values())]
        return {
            "format": 1,
            "trainer_version": self.version.value,
            "steps_done": self._steps_done,
            "next_group": self._next_group,
            "next_seq": self.buffer.state_dict()["next_seq"],
            "sampler": self.sampler.state_dict(),
            "ready": ready,
            "inflight": inflight,
            "awaiting_slot": awaiting,
            "open_batch": list(self._open_batch) if self._open_batch is not None else None,
            "source": self.source.source.state_dict(),
            "source_held": [prompt_to_dict(p) for p in self.source.held],
            "source_exhausted": self.source.exhausted,
            "ledger": self.ledger.state_dict(),
            "failed_groups": self._failed_groups,
            "staleness_hist": {str(k): n for k, n in self._staleness_hist.items()},
            "trainer_idle_s": self._trainer_idle_total,
            "elapsed_s": (self._now() - self._t0) if self._running else self._elapsed_before,
        }

    def _finished_prompt(self, slot: Slot) -> Prompt:
        """Prompt of a reserved group whose generation finished but which waits
        to commit in dispatch order (deterministic mode)."""
        rollout = self._commit_order.get(slot.group_id)
        if rollout is None:
            raise RuntimeError(f"in-flight group {slot.group_id!r} has no record; this is a bug")
        return rollout.prompt

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` before :meth:`run` (resume)."""
        if self._running:
            raise RuntimeError("load_state_dict must be called before run()")
        self.version = TrainerVersion(int(state["trainer_version"]))
        self._steps_done = int(state["steps_done"])
        self._next_group = int(state["next_group"])
        self.sampler.load_state_dict(state["sampler"])
        self.buffer.load_state_dict({
            "next_seq": int(state["next_seq"]),
            "slots": [{**r, "ready": True, "payload": rollout_from_dict(r["payload"])}
                      for r in state["ready"]],
        })
        self.ledger.load_state_dict(state["ledger"])
        self._resume_inflight = [
            _InFlight(r["group_id"], prompt_from_dict(r["prompt"]), r["target_step"],
                      start_weight=int(r.get("start_weight", self.version.value)),
                      attempts=int(r["attempts"]))
            for r in state["inflight"]
        ]
        self._resume_awaiting = [(prompt_from_dict(a["prompt"]), a["target_step"], a.get("pin"))
                                 for a in state["awaiting_slot"]]
        ob = state.get("open_batch")
        self._open_batch = (ob[0], int(ob[1]), ob[2] if len(ob) > 2 else None) if ob else None
        self.source.source.load_state_dict(state["source"])
        self.source.held = collections.deque(prompt_from_dict(p) for p in state["source_held"])
        self.source.exhausted = bool(state.get("source_exhausted", False))
        self._failed_groups = int(state.get("failed_groups", 0))
        self._staleness_hist = collections.Counter(
            {int(k): int(n) for k, n in state.get("staleness_hist", {}).items()})
        self._trainer_idle_total = float(state.get("trainer_idle_s", 0.0))
        self._elapsed_before = float(state.get("elapsed_s", 0.0))

    # =============================================================== metrics
    def _mark_busy(self) -> None:
        """Integrate the number of in-flight generations over time."""
        now = self._now() if self._running else self._busy_mark
        self._busy_area += len(self._inflight) * (now - self._busy_mark)
        self._busy_mark = now

    def _busy_area_now(self) -> float:
        self._mark_busy()
        return self._busy_area

    def _emit_step(
        self,
        v: int,
        step_start: float,
        idle: float,
        trained: list[tuple[Slot, int]],
        chunk_metrics: list[tuple[int, dict[str, float]]],
        step_metrics: dict[str, float],
        evicted: int,
        aborted: int,
    ) -> None:
        now = self._now()
        duration = max(now - step_start, 1e-12)
        staleness = [s for _, s in trained]
        rewards = [r for slot, _ in trained for r in slot.payload.rewards]
        hist = collections.Counter(staleness)
        self._staleness_hist.update(hist)
        self._trainer_idle_total += idle
        busy = self._busy_area_now() - self._busy_area_at_step
        record: dict[str, Any] = {
            "step": v,
            "trainer_version": v + 1,
            "wall_time_s": now - self._t0,
            "step_time_s": duration,
            "reward_mean": _mean(rewards),
            "staleness_mean": _mean(staleness),
            "staleness_max": max(staleness) if staleness else 0,
            "staleness_hist": {str(k): hist[k] for k in sorted(hist)},
            "groups_trained": len(trained),
            "groups_evicted": evicted,
            "groups_aborted": aborted,
            "groups_failed": self._step_counts.pop("failed", 0),
            "trainer_idle_s": idle,
            "buffer_ready": self.buffer.ready_count,
            "inflight": len(self._inflight),
            "generator_util": busy / (duration * self.cfg.max_inflight_prompts),
            "groups_per_s": len(trained) / duration,
        }
        keys = {k for _, m in chunk_metrics for k in m}
        for key in sorted(keys):
            vals = [(n, m[key]) for n, m in chunk_metrics if key in m]
            weight = sum(n for n, _ in vals) or 1
            record[f"train/{key}"] = sum(n * x for n, x in vals) / weight
        for key, value in step_metrics.items():
            record[f"train/{key}"] = value
        self._step_metrics.append(record)
        for sink in self.sinks:
            sink.write(record)

    @property
    def steps_done(self) -> int:
        return self._steps_done

    @property
    def step_records(self) -> list[dict[str, Any]]:
        return self._step_metrics

    def summary(self) -> dict[str, Any]:
        counts = self.ledger.counts()
        ok, why = self.ledger.check_balance({s.group_id for s in self.buffer.slots()})
        elapsed = (self._now() - self._t0) if self._running else (
            self._step_metrics[-1]["wall_time_s"] if self._step_metrics else 0.0
        )
        staleness_n = sum(self._staleness_hist.values())
        last = self._step_metrics[-10:]
        return {
            "steps": self._steps_done,
            "trainer_version": self.version.value,
            "stop_reason": self.stop_reason,
            "stop_message": self.stop_message,
            "sampler": type(self.sampler).__name__,
            "is_on_policy": bool(self.sampler.is_on_policy),
            "wall_time_s": elapsed,
            "ledger": {**counts, "balanced": ok, **({"imbalance": why} if not ok else {})},
            "staleness_mean": (
                sum(k * n for k, n in self._staleness_hist.items()) / staleness_n
                if staleness_n else 0.0
            ),
            "staleness_max": max(self._staleness_hist, default=0),
            "staleness_hist": {str(k): self._staleness_hist[k] for k in sorted(self._staleness_hist)},
            "reward_last10_mean": _mean([r["reward_mean"] for r in last]),
            "trainer_idle_s": self._trainer_idle_total,
            "max_inflight_seen": self._max_inflight_seen,
            "max_buffer_seen": self._max_buffer_seen,
        }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else math.nan


def _first_cause(group: BaseExceptionGroup) -> BaseException:
    """The first real error in a (nested) exception group."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_cause(exc)
        if not isinstance(exc, asyncio.CancelledError):
            return exc
    return group


class _suppress_all:
    """Best-effort cleanup: an error while shutting down must not mask the real one."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        if exc[1] is not None:
            log.debug("ignored error during shutdown: %r", exc[1])
        return exc[1] is not None and not isinstance(exc[1], asyncio.CancelledError)
