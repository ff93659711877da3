"""The train pump: one training step after the other until the run stops.

Per step ``v`` until its quota of groups is trained (``num_prompts_per_step``
less the groups it lost to ``on_dropped_prompt: shrink``): ``evict`` →
``select(min(min_groups_for_streaming_train, remaining), remaining)`` → train
the chunk (several chunks accumulate into one optimizer step); when nothing is
selectable, wait for the buffer to change — or, when the dispatcher reports
that nothing can arrive before this step ends, take whatever is eligible. Then
``finish_step``, the groups are recorded ``trained``, and the weight sync runs.

A stop request is honoured between trainer calls: the step in progress is
abandoned, its groups stay ``ready`` (they go into the checkpoint and are
trained again on resume), and the trainer's half-accumulated gradient is
never applied.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from asyncrl._util.text import plural
from asyncrl.buffer import Slot
from asyncrl.controller.context import RunContext
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.evaluation import Evaluator
from asyncrl.controller.failure_log import SHOWN_GROUPS, trainer_failed
from asyncrl.controller.stats import StepMark
from asyncrl.controller.weight_sync import WeightSync
from asyncrl.errors import AsyncRLError, GroupStillGenerating, RolloutStall
from asyncrl.metrics import MetricsSink
from asyncrl.trainers.base import TRAIN_S_IN_FINISH, Trainer
from asyncrl.types import Rollout, StopReason

log = logging.getLogger("asyncrl.controller")

T = TypeVar("T")


class TrainPump:
    def __init__(
        self,
        ctx: RunContext,
        trainer: Trainer,
        dispatcher: Dispatcher,
        weight_sync: WeightSync,
        sinks: Sequence[MetricsSink],
        after_step: Callable[[int], Awaitable[None]],
        evaluator: Evaluator | None = None,
    ) -> None:
        self.ctx = ctx
        self.evaluator = evaluator
        self.trainer = trainer
        self.dispatcher = dispatcher
        self.weight_sync = weight_sync
        self.sinks = sinks
        self.after_step = after_step
        #: Groups selected for the step in progress, not yet stepped on. After an
        #: interrupted step they are still here (and still ``ready`` in the ledger).
        self.taken: list[Slot] = []
        self.stop_reason: StopReason | str = StopReason.NOT_STARTED
        self.stop_message = ""
        self._stop_request: tuple[StopReason | str, str] | None = None
        #: What the pump is doing and since when (the watchdog names it).
        self.activity: tuple[str, float] = ("starting", 0.0)
        self._removed: list[Slot] = []
        ctx.buffer.add_remove_listener(self._removed.extend)

    def request_stop(self, reason: StopReason | str, message: str) -> None:
        if self._stop_request is None:
            self._stop_request = (reason, message)
            self.ctx.buffer.notify()  # a pump waiting for groups wakes and sees it

    def _stop(self, reason: StopReason | str, message: str) -> None:
        self.stop_reason, self.stop_message = reason, message
        log.info("stopping: %s", message)

    async def run(self) -> None:
        ctx = self.ctx
        self.stop_reason = StopReason.RUNNING
        while ctx.version.value < ctx.grpo.max_num_steps:
            if not await self._step(ctx.version.value):
                break
        else:
            if ctx.fatal and self._stop_request is not None:  # e.g. the last weight sync
                self._stop(*self._stop_request)
            else:
                self._stop(StopReason.MAX_NUM_STEPS,
                           f"reached grpo.max_num_steps={ctx.grpo.max_num_steps}")
        stats = ctx.stats
        if stats.steps_done and stats.skipped_steps >= stats.steps_done:
            # Each step warned already; this says what they add up to, at the end.
            log.warning("every step of this run (%d) skipped its optimizer step for a non-finite "
                        "gradient: the run trained nothing (summary.json: "
                        "skipped_nonfinite_steps); the warnings above name the likely cause",
                        stats.steps_done)

    async def _step(self, v: int) -> bool:
        """Train step ``v``; False when the run stops with it."""
        ctx = self.ctx
        ctx.assembling = v
        min_chunk = ctx.cfg.min_groups_for_streaming_train
        start = ctx.stats.mark(ctx.now())
        idle, evicted, train_s = 0.0, 0, 0.0
        chunk_metrics: list[tuple[int, dict[str, float]]] = []
        self.taken = taken = []
        complete = True
        # The quota is read afresh every round: a group dropped meanwhile may shrink it.
        while len(taken) < (n := ctx.drops.quota(v)):
            if self._stop_request is not None:
                self._stop(*self._stop_request)
                return False
            remaining = n - len(taken)
            evicted += await self._evict(v)
            chunk, extra = await self._select(v, min(min_chunk, remaining), remaining)
            evicted += extra
            if not chunk and self._stop_request is None and self.dispatcher.starved():
                # Nothing can arrive before this step ends (e.g. weight_fifo with fewer
                # groups left at the oldest version than min_groups_for_streaming_train):
                # waiting for a full streaming chunk would wait forever. (Not once the
                # run is stopping: a sampler that broke its contract is not asked again.)
                chunk, extra = await self._select(v, 1, remaining)
                evicted += extra
            if not chunk:
                if self._stop_request is not None:  # a fatal error (a sampler that
                    continue                         # raised): stop at the loop's top
                if self.dispatcher.exhausted():
                    if not taken:
                        self._stop(StopReason.SOURCE_EXHAUSTED,
                                   f"the prompt source ran dry after {v} steps")
                        return False
                    self._stop(
                        StopReason.INCOMPLETE_STEP,
                        f"the prompt source ran dry in the middle of step {v}: only "
                        f"{len(taken)} of the step's {n} groups could be trained, "
                        "so the last optimizer step used fewer groups. Give the task more "
                        "prompts or lower grpo.max_num_steps",
                    )
                    complete = False
                    break
                if self.dispatcher.starved():
                    raise RolloutStall(self._deadlock_message(v))
                idle += await self._wait_for_groups()
                continue
            # Held by the step before the trainer sees them: a stop or a cancellation
            # during train_chunk leaves them pending, never lost.
            taken.extend(chunk)
            self.activity = ("train_chunk", ctx.now())
            t = ctx.now()
            metrics = await self._trainer_call(
                "train_chunk", self.trainer.train_chunk([s.payload for s in chunk], step=v),
                v, chunk)
            ctx.timeline.add("train", 0, t, ctx.now(), str(v))
            train_s += ctx.now() - t
            chunk_metrics.append((len(chunk), metrics or {}))
        await self._finish(v, taken, start, idle, chunk_metrics, evicted, train_s)
        return complete

    async def _finish(self, v: int, taken: list[Slot], start: StepMark, idle: float,
                      chunk_metrics: list[tuple[int, dict[str, float]]], evicted: int,
                      train_s: float) -> None:
        ctx = self.ctx
        self.activity = ("finish_step", ctx.now())
        ctx.assembling = v + 1  # from here on a dropped group can only shrink a later step
        t = ctx.now()
        step_metrics = await self._trainer_call(
            "finish_step", self.trainer.finish_step(step=v), v, taken) or {}
        ctx.timeline.add("step", 0, t, ctx.now(), str(v))  # the optimizer step: trainer-busy
        # A float16 run's loss scaler skips a step on each overflow as it settles its
        # scale (asyncrl.trainers.precision): expected, counted but not warned of.
        if step_metrics.get("skipped_nonfinite_step") and "loss_scale" not in step_metrics:
            self._warn_skipped(v, taken)
        # Forward/backward run inside finish_step (mini-batches, deterministic
        # mode) is training time, as the trainer reports it.
        inner = min(step_metrics.pop(TRAIN_S_IN_FINISH, 0.0), ctx.now() - t)
        times = {"train_s": train_s + inner, "optimizer_step_s": ctx.now() - t - inner,
                 "eval_s": 0.0}
        trained = []
        for slot in taken:
            staleness = v - slot.start_weight
            ctx.ledger.trained(slot.group_id, step=v, staleness=staleness)
            trained.append((slot, staleness))
        self.taken = []
        self.activity = ("weight sync", ctx.now())
        aborted, sync_s = await self.weight_sync.after_step(v)
        ctx.progress()
        eval_metrics: dict[str, float] = {}
        # After a fatal error (an engine that failed to load the weights) the run
        # stops at this step's end: no evaluation on engines in doubt.
        if self.evaluator is not None and self.evaluator.due(v + 1) and not ctx.fatal:
            t = ctx.now()
            self.activity = ("evaluation", t)
            eval_metrics = await self.evaluator.evaluate(self.weight_sync.engines, v + 1)
            times["eval_s"] = ctx.now() - t
            ctx.progress()
        record = ctx.stats.step_record(
            step=v, now=ctx.now(), start=start, idle=idle, times=times,
            trained=trained, chunk_metrics=chunk_metrics, step_metrics=step_metrics,
            evicted=evicted, aborted=aborted, sync_s=sync_s,
            buffer_ready=ctx.buffer.ready_count, inflight=self.dispatcher.inflight,
            failures=ctx.drops.step_done(v),
        )
        record.update(eval_metrics)
        if ctx.dynamic is not None:
            record.update(ctx.dynamic.step_done(v, len(trained)))
        for sink in self.sinks:
            sink.write(record)
        self.activity = ("after-step hook", ctx.now())
        await self.after_step(v + 1)

    async def _trainer_call(self, name: str, call: Awaitable[T], v: int,
                            groups: Sequence[Slot]) -> T:
        """Await the trainer's ``name`` for step ``v``: an error of the trainer's
        own becomes one line naming the trainer, the call, the step and its
        groups (a TrainerError; the original is its cause). Not at a safe point:
        the trainer may have half-applied the step, so it is not checkpointed."""
        try:
            return await call
        except AsyncRLError:
            raise  # asyncrl's own (a lost trainer, a rank that died) name the fix already
        except Exception as exc:
            raise trainer_failed(self.trainer, name, exc, v,
                                 [s.group_id for s in groups]) from exc

    def _warn_skipped(self, v: int, taken: list[Slot]) -> None:
        """The trainer skipped step ``v``'s optimizer step (a non-finite gradient):
        warn, naming the likely cause, once per cause (the failure log counts the
        steps after the first). Rewards are checked finite when a group commits,
        so the suspects are the behavior log-probs the engines returned, read
        here only when a step was skipped, and else the model itself."""
        bad = [s.group_id for s in taken if not _finite_logprobs(s.payload)]
        if bad:
            shown = ", ".join(str(g) for g in bad[:SHOWN_GROUPS])
            more = f" and {len(bad) - SHOWN_GROUPS} more" if len(bad) > SHOWN_GROUPS else ""
            key = "trainer: non-finite gradient from non-finite engine log-probs"
            cause = (f"{len(bad)} of its {len(taken)} groups carry non-finite (NaN or inf) "
                     f"log-probs from the engine (groups {shown}{more}): fix the engine's "
                     "logprobs (docs/engines.md)")
        else:
            key = "trainer: non-finite gradient with finite log-probs and rewards"
            cause = ("its log-probs and rewards are finite, so the model's loss or gradient "
                     "overflowed (a diverging run: lower policy.optimizer.lr)")
        self.ctx.failures.warn(
            "optimizer step skipped", key, v,
            "step %d trained nothing: the trainer skipped its optimizer step because the "
            "gradient was not finite (train/skipped_nonfinite_step); %s", v, cause, unit="step")

    async def _wait_for_groups(self) -> float:
        """Wait for the buffer to change (a commit, a release, a dispatcher loop
        blocking, a stop request); returns the time waited."""
        ctx = self.ctx
        t = ctx.now()
        self.activity = ("waiting for groups", t)
        ctx.train_waiting = True
        try:
            await ctx.buffer.wait_changed()
        finally:
            ctx.train_waiting = False
        return ctx.now() - t

    # ------------------------------------------------------- sampler calls
    async def _evict(self, v: int) -> int:
        self._removed.clear()
        try:
            count = await self.ctx.sampler.evict(current_train_weight=v)
        except GroupStillGenerating as exc:  # the buffer refused it: nothing was removed
            self.ctx.sampler_broke_contract("evict", _removed_generating(exc))
            count = -1
        except Exception as exc:  # a bug in the sampler: stop with a checkpoint
            self.ctx.sampler_failed("evict", exc)
            count = -1
        removed, self._removed[:] = list(self._removed), []
        for slot in removed:  # the buffer removes ready slots only
            self.ctx.ledger.evicted(slot.group_id, step=v)
        if len(removed) != count:
            log.debug("sampler reported %d evictions, buffer saw %d", count, len(removed))
        return len(removed)

    async def _select(self, v: int, lo: int, hi: int) -> tuple[list[Slot], int]:
        """The sampler's chunk, and how many slots it removed without returning
        them (counted as evicted, so none goes missing from the ledger). A chunk
        that breaks select's contract stops the run (at its next safe point) and
        is trained by no one: what select removed is counted evicted."""
        removed = self._removed
        removed.clear()
        try:
            chunk = await self.ctx.sampler.select(
                current_train_weight=v, min_prompt_groups=lo, max_prompt_groups=hi)
        except GroupStillGenerating as exc:  # the buffer refused it: nothing was removed
            self.ctx.sampler_broke_contract("select", _removed_generating(exc))
            chunk = None
        except Exception as exc:  # a bug in the sampler: stop with a checkpoint
            self.ctx.sampler_failed("select", exc)
            chunk = None  # what it removed before raising is counted evicted below
        if chunk is None:
            if not removed:  # most asks: the chunk is still filling, nothing left the buffer
                return [], 0
            chunk = []
        else:
            broken = self._breach(chunk, lo, hi)
            if broken:
                self.ctx.sampler_broke_contract("select", broken)
                chunk = []
        # Each returned slot must be one select removed: one left in the buffer would
        # be trained now and again later, and the ledger would refuse its second end,
        # far from the cause. Counted, not looked up: this is the simulator's hot path.
        chosen = {id(s) for s in chunk}
        extra = [s for s in removed if id(s) not in chosen]
        if len(removed) - len(extra) < len(chunk):
            self.ctx.sampler_broke_contract("select", self._not_removed(chunk))
            chunk, extra = [], list(removed)
        removed.clear()
        for slot in extra:
            self.ctx.ledger.evicted(slot.group_id, step=v)
        return chunk, len(extra)

    @staticmethod
    def _breach(chunk: list[Slot], lo: int, hi: int) -> str:
        """How a chunk select returned breaks its contract, or "" when it does not:
        once per chunk, one attribute read per slot (the rest only on a breach)."""
        try:
            n = len(chunk)
            for slot in chunk:
                if not slot.ready:
                    return (f"returned group {slot.group_id!r}, which is not ready (still "
                            "generating): select returns ready slots only")
        except (AttributeError, TypeError):  # not a list of Slots: named below
            return (f"returned {_described(chunk)}; select returns a list of the Slot "
                    "objects it removed from the buffer (buffer.remove returns them), or None")
        if n > hi:
            return f"returned {plural(n, 'group')}, more than max_prompt_groups={hi}"
        if n < lo:
            return (f"returned {plural(n, 'group')}, fewer than min_prompt_groups={lo}: select "
                    "returns None when fewer than min_prompt_groups are eligible")
        return ""

    def _not_removed(self, chunk: list[Slot]) -> str:
        """What is wrong with a chunk that holds a slot select did not remove (or one twice)."""
        gone = {id(s) for s in self._removed}
        kept = next((s for s in chunk if id(s) not in gone), None)
        what = (f"group {kept.group_id!r}, which it did not remove from the buffer"
                if kept is not None else "a group twice")
        return (f"returned {what}: select must return the slots it removed from the buffer "
                "(buffer.remove returns them), each once")

    def _deadlock_message(self, v: int) -> str:
        buf = self.ctx.buffer
        return (
            f"deadlock at step {v}: no group can arrive ({self.dispatcher.describe()}; buffer "
            f"{len(buf)}/{buf.capacity} slots, {buf.ready_count} ready) and sampler "
            f"{type(self.ctx.sampler).__name__} selects none of the ready groups. A custom "
            "sampler must evict groups it will never select"
        )


def _finite_logprobs(rollout: Rollout) -> bool:
    """Every behavior log-prob of ``rollout`` is finite (a sum of floats is
    finite only if every term is; an overflow to inf is caught as well)."""
    return all(math.isfinite(sum(c.logprobs)) for c in rollout.result.completions)


def _removed_generating(exc: GroupStillGenerating) -> str:
    return (f"asked the buffer to remove group {exc.group_id!r}, which is still generating "
            "(that call removed nothing; what the sampler removed before it is counted "
            "evicted): select and evict remove ready slots only; a group in flight is ended "
            "by should_abort_inflight")


def _described(chunk: object) -> str:
    """What a select returned instead of a list of Slots, in a few words."""
    try:
        odd = next((x for x in chunk if not isinstance(x, Slot)), None)  # type: ignore[attr-defined]
    except TypeError:  # not iterable
        return f"{type(chunk).__name__} {chunk!r:.60}"
    if odd is None:
        return f"a {type(chunk).__name__}"
    return f"a {type(chunk).__name__} holding {type(odd).__name__} {odd!r:.40}"
