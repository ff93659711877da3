"""Deterministic mode as a policy object: it does nothing unless enabled.

What makes a run reproducible (docs/checkpointing.md):

* each dispatch batch is generated with the weight version the sampler pins it
  to (its ``pinned_weight_version`` fact), not whatever the engine holds;
* each group samples from its own seed;
* finished groups commit strictly in dispatch order, so which groups a
  ``select`` sees never depends on which generation finished first;
* the engines keep exactly the weight versions some live or future batch is
  pinned to.

:class:`NoDeterminism` is the default: every hook is a pass-through, so the
rest of the controller has no ``if deterministic`` branches.
"""

from __future__ import annotations

import collections
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from asyncrl.controller.validation import pinned_weight_version
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.errors import SetupError
from asyncrl.sampling import PromptGroupSampler
from asyncrl.types import GroupId


class NoDeterminism:
    """Timing decides; groups commit as they finish."""

    enabled = False

    def pin(self, dispatch_index: int) -> int | None:
        return None

    def seed(self, group_id: GroupId) -> int | None:
        return None

    def reserved(self, group_id: GroupId) -> None:
        return None

    def finished(self, group_id: GroupId, item: Any) -> list[Any]:
        """Items that may commit now, in order: here just the one that finished."""
        return [item]

    def dropped(self, group_id: GroupId) -> list[Any]:
        return []

    def waiting(self, group_id: GroupId) -> Any:
        return None

    async def retain(
        self, engines: Sequence[RolloutEngine], pins: Iterable[int | None], next_dispatch: int,
        version: int,
    ) -> None:
        return None


class Determinism(NoDeterminism):
    """Pinned weight versions, per-group seeds and in-order commits."""

    enabled = True

    def __init__(self, sampler: PromptGroupSampler, engines: Sequence[RolloutEngine],
                 capabilities: Sequence[EngineCapabilities], seed: int) -> None:
        missing = [type(e).__name__ for e, c in zip(engines, capabilities)
                   if not c.pinned_versions]
        if missing:
            raise SetupError(
                f"deterministic: true needs engines that keep pinned weight versions "
                f"(retain_weight_versions); {', '.join(sorted(set(missing)))} cannot. Use the "
                "local engine, or set deterministic: false"
            )
        self.sampler = sampler
        self.run_seed = seed
        #: Reserved groups in dispatch order -> their finished item (None until it finishes).
        self._order: collections.OrderedDict[GroupId, Any] = collections.OrderedDict()

    def pin(self, dispatch_index: int) -> int | None:
        return pinned_weight_version(self.sampler, dispatch_index)

    def seed(self, group_id: GroupId) -> int | None:
        digest = hashlib.blake2b(f"{self.run_seed}:{group_id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "little") & 0x7FFF_FFFF

    def reserved(self, group_id: GroupId) -> None:
        self._order[group_id] = None

    def finished(self, group_id: GroupId, item: Any) -> list[Any]:
        self._order[group_id] = item
        return self._flush()

    def dropped(self, group_id: GroupId) -> list[Any]:
        """A group left without committing (aborted, failed): later ones may go."""
        self._order.pop(group_id, None)
        return self._flush()

    def waiting(self, group_id: GroupId) -> Any:
        """The finished item of a group still waiting for an earlier one, or None."""
        return self._order.get(group_id)

    def _flush(self) -> list[Any]:
        out = []
        while self._order:
            item = next(iter(self._order.values()))
            if item is None:
                break
            self._order.popitem(last=False)
            out.append(item)
        return out

    async def retain(
        self, engines: Sequence[RolloutEngine], pins: Iterable[int | None], next_dispatch: int,
        version: int,
    ) -> None:
        """Tell the engines which weight versions are still needed: those of live
        groups, and every version from the next batch's pin on (pins only grow)."""
        floor = self.pin(next_dispatch)
        keep = {p for p in pins if p is not None}
        if floor is not None:
            keep.update(range(floor, version + 1))
        keep.add(version)
        for engine in engines:
            await engine.retain_weight_versions(keep)  # type: ignore[attr-defined]
