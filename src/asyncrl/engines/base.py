"""What a rollout engine must provide to the controller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from asyncrl.types import GenerationRequest, GroupId, GroupResult


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates prompt groups with the weights it currently holds.

    Several ``generate`` calls run concurrently (the controller bounds them by
    ``async_rl.max_inflight_prompts``), and ``update_weights`` may arrive while
    they run: a group then finishes on newer weights and reports
    ``end_weight > start_weight``.
    """

    @property
    def weight_version(self) -> int:
        """The version of the weights the engine holds now. Read by the rollout
        pump when it dispatches a group."""
        ...

    async def generate(self, request: GenerationRequest) -> GroupResult:
        """Called by the rollout pump once per attempt of a prompt group. Returns
        ``request.num_generations`` completions with behavior log-probs and the
        weight versions at start and end. Raises on failure (the controller
        retries with backoff); raises :class:`~asyncrl.errors.EngineUnavailable`
        when the attempt was lost with the engine's worker (retried at once
        elsewhere, not charged to the group); raises
        :class:`~asyncrl.types.GroupAborted` or is cancelled when the group is
        aborted. An engine may also expose an optional ``healthy`` property:
        the controller does not pick an unhealthy engine while another is
        healthy."""
        ...

    async def update_weights(self, weights: Any, version: int) -> None:
        """Called by the train pump after every optimizer step, before the trainer
        version advances: once it returns, new generation uses ``version``.
        ``weights`` is what the trainer's ``get_weights`` returned (for the built-in
        pair: a CPU state dict)."""
        ...

    async def abort(self, group_ids: Sequence[GroupId]) -> None:
        """Called when the sampler calls in-flight groups hopeless after a weight
        sync, and at shutdown: stop spending compute on them."""
        ...

    async def invalidate_cache(self) -> None:
        """Called after a weight sync when the sampler is on-policy and
        ``recompute_kv_cache_after_weight_updates`` is set: drop KV/prefix caches
        computed with older weights."""
        ...

    async def close(self) -> None:
        """Called once when the run ends (success, error or cancellation)."""
        ...
