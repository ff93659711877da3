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
    they run: a group then finishes on newer weights, and each of its tokens
    reports the version that sampled it (``end_weight > start_weight``).

    Optional: ``async def snapshot(group_ids) -> dict[GroupId, GroupResult]``,
    called before a checkpoint is written while groups generate: the tokens each
    has so far (unfinished completions), without stopping it. Without it a
    checkpoint keeps only those groups' prompts. See docs/partial_rollouts.md.
    """

    @property
    def weight_version(self) -> int:
        """The version of the weights the engine holds now. Read by the rollout
        pump when it dispatches a group."""
        ...

    async def generate(self, request: GenerationRequest) -> GroupResult:
        """Called by the rollout pump once per attempt of a prompt group. Returns
        ``request.num_generations`` finished completions, each token with its
        behaviour log-prob and the weight version that sampled it
        (:mod:`asyncrl.record`), and ``request.start_weight`` echoed as the
        group's start weight; continues ``request.prefix`` when given. Raises on failure (the controller
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
        sync, at a graceful stop, and at shutdown: stop spending compute on them.
        Their ``generate`` raises :class:`~asyncrl.types.GroupAborted`, with the
        tokens they had as ``partial`` when the engine can give them (a stop
        keeps them for the resume)."""
        ...

    async def invalidate_cache(self) -> None:
        """Called after a weight sync when the sampler is on-policy and
        ``recompute_kv_cache_after_weight_updates`` is set: drop KV/prefix caches
        computed with older weights."""
        ...

    async def close(self) -> None:
        """Called once when the run ends (success, error or cancellation)."""
        ...
