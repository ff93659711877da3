"""A custom staleness sampler: train only on the freshest weight version available.

``FreshestOnlySampler`` is a complete, runnable ``PromptGroupSampler``. At
trainer version ``v`` with window ``s`` it looks at the ready groups whose
start weight lies in ``[v - s, v]``, picks the newest such weight version and
trains only groups of that version. Older in-window groups stay buffered (they
are taken once nothing fresher is ready) and fall out of the window like the
built-in ``windowed`` policy's. Admission is gated like ``weight_fifo``, so
generation never runs more than ``s`` batches ahead of training.

Use it from a run config (see ``custom_sampler.yaml`` beside this file)::

    async_rl:
      sampler: {name: custom, target: "custom_sampler:FreshestOnlySampler",
                max_staleness_versions: 1}

with this directory on ``PYTHONPATH``. Every key besides ``name`` and
``target`` is passed to the constructor, after the rollout buffer.

Run this file to watch it pick groups from a small buffer::

    python examples/custom_sampler.py
"""

from __future__ import annotations

import asyncio

from asyncrl.buffer import RolloutBuffer, Slot
from asyncrl.sampling import BaseSampler, PromptGroupSampler, create_sampler


class FreshestOnlySampler(BaseSampler):
    """Train the newest in-window weight version first, one version per chunk."""

    # The inherited admit waits on the TrainerVersion (no polling) until batch d
    # satisfies d <= v + s. Nothing is stamped: select reads start weights only.
    gated = True

    def __init__(self, buffer: RolloutBuffer, max_staleness_versions: int = 1) -> None:
        # BaseSampler keeps the buffer and the dispatch counter (set_dispatch_index,
        # state_dict and load_state_dict work without more code).
        super().__init__(buffer)
        if isinstance(max_staleness_versions, bool) or not isinstance(max_staleness_versions, int):
            raise TypeError(
                f"max_staleness_versions must be an int, got {max_staleness_versions!r}"
            )
        if max_staleness_versions < 0:
            raise ValueError(f"max_staleness_versions must be >= 0, got {max_staleness_versions}")
        # ``window`` drives the inherited gate, is_on_policy and required_buffer_capacity.
        self.window = max_staleness_versions

    async def select(
        self, *, current_train_weight: int, min_prompt_groups: int, max_prompt_groups: int
    ) -> list[Slot] | None:
        self._check_bounds(min_prompt_groups, max_prompt_groups)
        floor = self._floor(current_train_weight)
        # The buffer's indexes answer both questions without scanning it.
        freshest = self.buffer.ready_in_weight_range(
            floor, current_train_weight, limit=1, freshest_first=True
        )
        if not freshest:
            return None
        newest = freshest[0].start_weight
        eligible = self.buffer.ready_in_weight_range(newest, newest, limit=max_prompt_groups)
        # Greedy, as the contract asks: all of them (already capped at max) or None.
        return self._take(eligible, min_prompt_groups)

    async def evict(self, *, current_train_weight: int) -> int:
        # Only groups below the window can never be selected again; in-flight
        # slots are never touched (the index holds ready slots only).
        stale = self.buffer.ready_in_weight_range(None, self._floor(current_train_weight) - 1)
        return self._evict_slots(stale)

    def should_abort_inflight(
        self, *, start_weight_version: int, current_train_weight: int
    ) -> bool:
        # A group started below the window would be evicted the moment it finished.
        return start_weight_version < current_train_weight - self.window


async def _demo() -> None:
    buffer = RolloutBuffer(capacity=16)
    # The same path a run takes: the config names the class by "module:ClassName".
    sampler = create_sampler(
        buffer,
        {
            "name": "custom",
            "target": "custom_sampler:FreshestOnlySampler",
            "max_staleness_versions": 2,
        },
    )
    assert isinstance(sampler, PromptGroupSampler)

    # Three finished groups for each weight version 0, 1 and 2, and one still generating at 2.
    for weight in (0, 1, 2):
        for i in range(3):
            group_id = f"w{weight}-{i}"
            await buffer.reserve(group_id, start_weight=weight)
            buffer.commit(group_id, payload=None)
    await buffer.reserve("w2-late", start_weight=2)

    async def step(v: int) -> None:
        evicted = await sampler.evict(current_train_weight=v)
        chosen = await sampler.select(
            current_train_weight=v, min_prompt_groups=1, max_prompt_groups=4
        )
        picked = [s.group_id for s in chosen] if chosen else None
        print(f"v={v}: evicted {evicted}, selected {picked}")

    await step(2)  # the freshest version, 2, first
    await step(2)  # then 1, the freshest one left
    buffer.commit("w2-late", payload=None)
    await step(3)  # version 0 fell out of the window [1, 3]; the late group of 2 is next


if __name__ == "__main__":
    # Running this file makes its directory importable, so the target above
    # resolves exactly as it would from a config file.
    asyncio.run(_demo())
