"""What every config block is made of: frozen models that refuse unknown keys,
and strict number types (YAML's ``true`` is not 1; a float field still takes a
YAML int)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt

PosInt = Annotated[StrictInt, Field(ge=1)]
NonNegInt = Annotated[StrictInt, Field(ge=0)]
PosFloat = Annotated[StrictFloat, Field(gt=0)]
NonNegFloat = Annotated[StrictFloat, Field(ge=0)]


class Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


__all__ = ["Block", "NonNegFloat", "NonNegInt", "PosFloat", "PosInt"]
