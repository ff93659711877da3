"""Weight sync: what happens between two training steps, in this order.

1. ``trainer.get_weights()`` and ``engine.update_weights(weights, v + 1)`` on
   every engine;
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

from asyncrl.controller.context import RunContext
from asyncrl.controller.determinism import NoDeterminism
from asyncrl.controller.dispatch import Dispatcher
from asyncrl.engines.base import RolloutEngine
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
        weights = await self.trainer.get_weights()
        await asyncio.gather(*(e.update_weights(weights, new) for e in self.engines))
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
