"""What a rollout engine must provide to the controller.

Optional members (abort, cache invalidation, partial snapshots, health, pinned
weight versions, a weights device, load reports) are the small protocols of
:mod:`asyncrl.engines.capabilities`, read once when the controller gets the
engine.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from asyncrl.types import GenerationRequest, GroupResult


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates prompt groups with the weights it currently holds.

    Several ``generate`` calls run concurrently (the controller bounds them by
    ``async_rl.max_inflight_prompts``), and ``update_weights`` may arrive while
    they run: a group then finishes on newer weights, and each of its tokens
    reports the version that sampled it (``end_weight > start_weight``).
    """

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
        aborted."""
        ...

    async def update_weights(self, weights: Any, version: int) -> None:
        """Called by the train pump after every optimizer step, before the trainer
        version advances: once it returns, new generation uses ``version``.
        ``weights`` is what the trainer's ``get_weights`` returned (for the built-in
        pair: a state dict on the engine's ``device``, see
        :class:`~asyncrl.engines.capabilities.WeightsOnDevice`); how it reaches
        the engine's model is the engine's :mod:`weight transport
        <asyncrl.engines.transport>`."""
        ...

    async def close(self) -> None:
        """Called once when the run ends (success, error or cancellation)."""
        ...
