"""The group-granular rollout buffer shared by the rollout and train pumps."""

from asyncrl.buffer.rollout_buffer import GroupId, RolloutBuffer, Slot

__all__ = ["GroupId", "RolloutBuffer", "Slot"]
