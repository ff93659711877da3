"""Weight sync: what happens between two training steps, in this order.

1. ``trainer.get_weights()`` and ``engine.update_weights(weights, v + 1)`` on
   every engine (one that raises is a bug of that engine: the run stops at the
   end of this step, which is whole, with a checkpoint);
2. only then ``version.set(v + 1)``: admission sees the new version only once
   every engine holds the new weights, so a batch admitted at version ``v`` is
   generated with weights ``>= v`` (an on-policy run really is on-policy);
3. in-flight groups the sampler calls hopeless are aborted (released,
   recorded ``aborted``, and each engine told);
4. engine caches are invalidated when the sampler is on-policy or
   ``async_rl.recompute_kv_cache_after_weight_updates`` is set;
5. deterministic mode: the engines drop weight versions no batch is pinned to.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import NoDeterminism
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.failure_log import trainer_failed, weight_load_failed
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import AsyncRLError, BackendBug
from asyncrl.trainers.base import Trainer
from asyncrl.types import GroupId


class WeightSync:
    def __init__(
        self,
        ctx: RunContext,
        engines: Sequence[RolloutEngine],
        trainer: Trainer,
        dispatcher: Dispatcher,
        determinism: NoDeterminism,
    ) -> None:
        self.ctx = ctx
        self.engines = list(engines)
        self.trainer = trainer
        self.dispatcher = dispatcher
        self.determinism = determinism

    async def after_step(self, step: int) -> tuple[int, float]:
        """Publish the weights of step ``step``; returns (groups aborted, sync seconds)."""
        ctx = self.ctx
        new = step + 1
        start = ctx.now()
        try:
            weights = await self.trainer.get_weights()
        except AsyncRLError:
            raise
        except Exception as exc:
            raise trainer_failed(self.trainer, "get_weights", exc, step) from exc
        # Every engine's load ends before the outcome is read: one that raised
        # must not leave another's load running past the stop.
        loads = await asyncio.gather(*(e.update_weights(weights, new) for e in self.engines),
                                     return_exceptions=True)
        for idx, outcome in enumerate(loads):
            if isinstance(outcome, Exception) and not isinstance(outcome, AsyncRLError):
                self.ctx.fail(self._load_failed(idx, outcome, step), key=f"update_weights {idx}")
            elif isinstance(outcome, BaseException):
                raise outcome  # asyncrl's own errors (a lost worker) and cancellation
        end = ctx.now()
        ctx.timeline.add("sync", 0, start, end, str(step))
        ctx.version.set(new)
        by_engine = self._abort_hopeless(new)
        for idx, group_ids in by_engine.items():
            # None: aborted before its first attempt reached an engine. An engine
            # that cannot abort has had the groups' generate calls cancelled.
            if idx is not None and ctx.capabilities[idx].abort:
                await self.engines[idx].abort(group_ids)  # type: ignore[attr-defined]
        if ctx.sampler.is_on_policy or ctx.cfg.recompute_kv_cache_after_weight_updates:
            await asyncio.gather(*(e.invalidate_cache()  # type: ignore[attr-defined]
                                   for e, c in zip(self.engines, ctx.capabilities)
                                   if c.invalidate_cache))
        await self.determinism.retain(self.engines, self.dispatcher.live_pins(),
                                      self.dispatcher.admitted, new)
        return sum(len(g) for g in by_engine.values()), end - start

    def _abort_hopeless(self, version: int) -> dict[int | None, list[GroupId]]:
        """After the sync to ``version``: abort the in-flight groups the sampler
        calls hopeless (released, recorded ``aborted``, their tasks cancelled).

        Returns them by engine (the caller tells each engine). The sampler is
        asked once per distinct start weight, so the cost does not grow with
        the number of groups in flight.
        """
        sampler = self.ctx.sampler
        dispatcher = self.dispatcher
        doomed = {w for w in dispatcher.inflight_weights
                  if sampler.should_abort_inflight(start_weight_version=w,
                                                   current_train_weight=version)}
        by_engine: dict[int | None, list[GroupId]] = collections.defaultdict(list)
        if not doomed:
            return by_engine
        ctx = self.ctx
        now = ctx.now()
        for entry in [e for e in dispatcher.active.values()
                      if e.state.inflight and e.start_weight in doomed]:
            entry.aborted = True
            ctx.buffer.release(entry.group_id)
            ctx.ledger.aborted(entry.group_id, attempts=entry.attempts, time=now)
            dispatcher.leave(entry, now)
            dispatcher.commit_all(self.determinism.dropped(entry.group_id))
            by_engine[entry.engine].append(entry.group_id)
            if entry.task is not None:
                entry.task.cancel()
        return by_engine

    def _load_failed(self, idx: int, error: Exception, step: int) -> BackendBug:
        """Engine ``idx``'s ``update_weights`` raised after step ``step``: a bug of
        that engine. The step itself is whole (the trainer finished it), so the
        run goes on to the step's end and stops there, at a safe point: the
        version advances with the trainer's, nothing more is dispatched, and the
        checkpoint holds the step (a resume loads its weights into the engines)."""
        return weight_load_failed(
            self.engines[idx], idx, error, step + 1, when=f"after training step {step}",
            state="The step is complete and goes into the checkpoint")
