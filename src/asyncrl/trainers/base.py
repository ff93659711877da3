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
        thread (the event loop keeps serving), while no other trainer call runs.
        Training goes on while the checkpoint is written, so the tensors must be
        copies. (A trainer may also offer ``final_state_dict()``: the same state,
        called once the run has stopped, free to share its tensors; see
        :func:`final_state_dict`.)"""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called on resume, before the pumps start."""
        ...

    async def close(self) -> None:
        """Called once when the run ends."""
        ...


def final_state_dict(trainer: Trainer) -> dict[str, Any]:
    """The trainer's state once the run has stopped (the final checkpoint and the
    final policy; no trainer call follows): its ``final_state_dict()`` where it
    has one - the state without copying tensors it already holds on the CPU -
    else its ``state_dict()``."""
    final = getattr(trainer, "final_state_dict", None)
    return final() if final is not None else trainer.state_dict()
