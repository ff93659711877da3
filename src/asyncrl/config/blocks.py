"""What every config block is made of: :class:`Block`, the one base class
(frozen models that refuse unknown keys), strict number types (YAML's ``true``
is not 1; a float field still takes a YAML int), and :class:`TaskBlock`, what
every ``task`` block has besides its own keys."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, field_validator

PosInt = Annotated[StrictInt, Field(ge=1)]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
PosFloat = Annotated[StrictFloat, Field(gt=0)]
NonNegFloat = Annotated[StrictFloat, Field(ge=0)]


def split_target(target: str) -> tuple[str, str] | None:
    """``"module:attr"`` (the form every ``target`` and ``rollout`` key takes, and
    :func:`pkgutil.resolve_name` reads) -> ``("module", "attr")``; None when
    ``target`` is not of that form. The one check of the form."""
    module_name, sep, attr = target.strip().partition(":")
    if not sep or not module_name or not attr or ":" in attr:
        return None
    return module_name, attr


class Block(BaseModel):
    """A config block. A block whose other keys go somewhere (a ``custom``
    target's constructor, a NeMo-RL block accepted off) sets ``extra="allow"``
    in its own ``model_config``; it stays frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TaskBlock(Block):
    """The one field the built-in task blocks (:mod:`asyncrl.config.schema`) and
    the dataset task's (:mod:`asyncrl.config.dataset`) share."""

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
        if value is not None and split_target(value) is None:
            raise ValueError(f"{value!r} is not of the form 'module:function'; write e.g. "
                             "rollout: \"tool_use:calculator\"")
        return value


__all__ = ["Block", "NonNegFloat", "NonNegInt", "PosFloat", "PosInt", "TaskBlock",
           "split_target"]
