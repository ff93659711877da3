"""Rollout functions: multi-turn rollouts, tool calls and environments.

``task.rollout: "module:function"`` names an ``async def fn(prompt, session) ->
RolloutOutput`` run for every generation attempt of a prompt group, in place
of the built-in single turn (docs/rollouts.md). The session
(:class:`RolloutSession`) lets it generate with the policy, append environment
tokens and end transcripts; what it returns is the group's per-token record
(:mod:`asyncrl.record`) and rewards.
"""

from asyncrl.rollouts.engine import (
    RolloutFunction,
    RolloutFunctionEngine,
    RolloutFunctionError,
    with_rollout_function,
)
from asyncrl.rollouts.output import RolloutOutput
from asyncrl.rollouts.session import EngineSession, RolloutContractError, RolloutSession
from asyncrl.rollouts.target import apply_rollout, load_rollout

__all__ = [
    "EngineSession",
    "RolloutContractError",
    "RolloutFunction",
    "RolloutFunctionEngine",
    "RolloutFunctionError",
    "RolloutOutput",
    "RolloutSession",
    "apply_rollout",
    "load_rollout",
    "with_rollout_function",
]
