"""What a trainer must provide to the controller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from asyncrl.types import Rollout


@runtime_checkable
class Trainer(Protocol):
    """Consumes prompt groups chunk by chunk and takes one optimizer step per
    training step (``num_prompts_per_step`` groups)."""

    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        """Called by the train pump for every chunk the sampler selects during step
        ``step``: compute the loss and accumulate gradients. Returns chunk metrics
        (averaged by group count into the step's metrics)."""
        ...

    async def finish_step(self, *, step: int) -> dict[str, float]:
        """Called once per step, after its groups went through ``train_chunk``:
        take the optimizer step (weights ``step`` -> ``step + 1``). Returns step
        metrics (loss, grad norm, ...)."""
        ...

    async def get_weights(self) -> Any:
        """Called right after ``finish_step``: the new weights, in the form the
        engines' ``update_weights`` takes."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Called when a checkpoint is written (model, optimizer, RNG), in a worker
        thread (the event loop keeps serving), while no other trainer call runs."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called on resume, before the pumps start."""
        ...

    async def close(self) -> None:
        """Called once when the run ends."""
        ...
