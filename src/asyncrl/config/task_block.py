"""What every ``task`` block has besides its own keys: the rollout function.

A block of its own (imported by :mod:`asyncrl.config` and
:mod:`asyncrl.config.dataset`) so that both kinds of task block share the one
field, and neither imports the other.
"""

from __future__ import annotations

from pydantic import field_validator

from asyncrl.config.blocks import Block


class TaskBlock(Block):
    #: ``"module:function"``: an ``async def rollout(prompt, session) -> RolloutOutput``
    #: that runs each generation attempt of a prompt group - multi-turn, tool
    #: calls, an environment (docs/rollouts.md). None: the built-in single-turn
    #: rollout (generate the completions, then score their texts with the reward).
    rollout: str | None = None

    @field_validator("rollout")
    @classmethod
    def _form(cls, value: str | None) -> str | None:
        # Only the form here (loading a config imports no user code); the target
        # is imported and checked by asyncrl validate / train (asyncrl.rollouts).
        if value is not None:
            module, sep, name = value.partition(":")
            if not (module and sep and name) or ":" in name:
                raise ValueError(f"{value!r} is not of the form 'module:function'; write e.g. "
                                 "rollout: \"tool_use:calculator\"")
        return value


__all__ = ["TaskBlock"]
