"""What a trainer must provide to the controller."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, cast, runtime_checkable

from asyncrl.trainers.capabilities import FinalState, TrainerCapabilities
from asyncrl.types import Rollout

#: ``finish_step``'s metric: seconds of it spent on forward/backward passes.
TRAIN_S_IN_FINISH = "time/train_in_finish_s"


@runtime_checkable
class Trainer(Protocol):
    """Consumes prompt groups chunk by chunk and takes one optimizer step per
    training step (``num_prompts_per_step`` groups).

    A trainer may offer more, each an optional protocol of
    :mod:`asyncrl.trainers.capabilities`, read once when the controller gets
    the trainer and used only where the trainer has it:

    * ``final_state_dict()`` - called once the run has stopped, instead of
      ``state_dict()`` (the final checkpoint and the final policy): the same
      state, free to share its tensors;
    * ``sharded_state_dict(directory)`` - called instead of ``state_dict()``
      when a checkpoint is written: the trainer writes its shards itself.
    """

    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        """Called by the train pump for every chunk the sampler selects during step
        ``step``: compute the loss and accumulate gradients. Returns chunk metrics
        (averaged by group count into the step's metrics)."""
        ...

    async def finish_step(self, *, step: int) -> dict[str, float]:
        """Called once per step, after its groups went through ``train_chunk``:
        take the optimizer step (weights ``step`` -> ``step + 1``). Returns step
        metrics (loss, grad norm, ...). A trainer that runs forward and backward
        passes here (several optimizer steps per training step, or groups held
        back for deterministic mode) reports their seconds under
        :data:`TRAIN_S_IN_FINISH`, so the step's time split counts them as
        training, not as the optimizer step."""
        ...

    async def get_weights(self) -> Any:
        """Called right after ``finish_step``: the new weights, in the form the
        engines' ``update_weights`` takes."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Called when a checkpoint is written (model, optimizer, RNG), in a worker
        thread (the event loop keeps serving), while no other trainer call runs.
        Training goes on while the checkpoint is written, so the tensors must be
        copies."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called on resume, before the pumps start."""
        ...

    async def close(self) -> None:
        """Called once when the run ends."""
        ...


def final_state_dict(trainer: Trainer, caps: TrainerCapabilities | None = None
                     ) -> dict[str, Any]:
    """The trainer's state once the run has stopped (the final checkpoint and the
    final policy; no trainer call follows): its ``final_state_dict()`` where it
    has one (:class:`~asyncrl.trainers.capabilities.FinalState`: the state
    without copying tensors it already holds on the CPU), else its
    ``state_dict()``. ``caps``: the trainer's capabilities, when already read."""
    caps = caps if caps is not None else TrainerCapabilities.of(trainer)
    if caps.final_state_dict:
        return cast(FinalState, trainer).final_state_dict()
    return trainer.state_dict()
