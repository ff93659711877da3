"""Overrides that swap a discriminated block (``task.reward.name=exact_match``,
``async_rl.sampler.name=windowed``, ``simulate.generation_latency_s.distribution=constant``):
found from the schema, so every such block behaves alike.

A swap keeps the old block's keys that the new member also has (a reward's
pool keys ``num_workers``, ``timeout_s``, ``executor``) and drops the others
(``target`` of a ``custom`` reward), which the new member would refuse as
unknown; :func:`swap_block` says which it dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticSerializationError, PydanticUndefined, to_jsonable_python

from asyncrl.config.explain import annotation_members
from asyncrl.config.schema import RunConfig


@dataclass(frozen=True)
class Swap:
    """What replacing a block's member did: ``block`` is the new block's keys."""

    block: dict[str, Any]
    dropped: tuple[str, ...]


def _models(annotation: Any) -> list[type[BaseModel]]:
    return [m for m in annotation_members(annotation)
            if isinstance(m, type) and issubclass(m, BaseModel)]


def swap_members(key: str) -> list[type[BaseModel]] | None:
    """The members of the discriminated block whose tag ``key`` names (``task.reward.name``
    -> the reward configs), or None when ``key`` is no block's discriminator."""
    *path, tag = key.split(".")
    models: list[type[BaseModel]] = [RunConfig]
    field = None
    for part in path:
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if not fields:
            return None
        field = fields[0]
        models = _models(field.annotation)
    if field is None or field.discriminator != tag:
        return None
    return models


def is_swap(key: str) -> bool:
    return swap_members(key) is not None


def swap_block(key: str, old: dict[str, Any], value: Any, was: Any = None) -> Swap:
    """The block ``old`` (member ``was``: its tag, or the block's default tag when it
    names none) becomes when the override ``key=value`` picks its member: the keys
    the new member declares are kept, the others dropped (a member that takes any
    key, a ``custom`` sampler's constructor keys, keeps only those it declares: the
    old member's knobs are no arguments of the user's class)."""
    tag = key.rsplit(".", 1)[1]
    members = swap_members(key) or []
    new = next((m for m in members if _tag(m, tag) == value), None)
    if new is None:  # no such member: validation names the choices; keep the rest as it is
        return Swap({**old, tag: value}, ())
    before = next((m for m in members if _tag(m, tag) == old.get(tag, was)), None)
    kept = {tag: value}
    dropped = []
    for name, item in old.items():
        if name == tag:
            continue
        if name in new.model_fields:
            kept[name] = item
        elif before is None or not _at_default(before, name, item):
            # Named only when set to something: a written-out config (a resumed run's
            # config.yaml) lists every key at its default, and those say nothing.
            dropped.append(name)
    return Swap(kept, tuple(dropped))


def _at_default(model: type[BaseModel], name: str, value: Any) -> bool:
    """Whether ``value`` (as a config file holds it) is ``model``'s default for ``name``."""
    field = model.model_fields.get(name)
    if field is None:
        return False
    default = field.get_default(call_default_factory=True)
    if default is PydanticUndefined:
        return False
    try:
        return bool(to_jsonable_python(default) == to_jsonable_python(value))
    except PydanticSerializationError:
        return False


def _tag(model: type[BaseModel], tag: str) -> Any:
    field = model.model_fields.get(tag)
    return None if field is None else field.default
