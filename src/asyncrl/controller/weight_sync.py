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
from collections.abc import Sequence

from asyncrl._util.text import qualified_name
from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import NoDeterminism
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.controller.failure_log import trainer_failed
from asyncrl.engines.base import RolloutEngine
from asyncrl.errors import AsyncRLError, BackendBug
from asyncrl.trainers.base import Trainer


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
        by_engine = self.dispatcher.abort_hopeless(new)
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

    def _load_failed(self, idx: int, error: Exception, step: int) -> BackendBug:
        """Engine ``idx``'s ``update_weights`` raised after step ``step``: a bug of
        that engine. The step itself is whole (the trainer finished it), so the
        run goes on to the step's end and stops there, at a safe point: the
        version advances with the trainer's, nothing more is dispatched, and the
        checkpoint holds the step (a resume loads its weights into the engines)."""
        bug = BackendBug(
            f"engine {idx} ({qualified_name(self.engines[idx])}) raised "
            f"{type(error).__name__}: {error} in update_weights(weights, {step + 1}) after "
            f"training step {step}. An engine's update_weights must not raise: it is a bug "
            "in that engine. The step is complete and goes into the checkpoint; fix the "
            "engine, then resume the run from its checkpoint")
        bug.__cause__ = error
        return bug
