"""Turn pydantic validation errors into one message per field, with a fix.

Unknown keys get the closest valid key suggested; the dotted path of every
problem is given as a user would write it in YAML or on the command line.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from typing import Any, Union

from pydantic import BaseModel, ValidationError


def _members(annotation: Any) -> list[Any]:
    """Flatten Annotated/Union/Optional into the concrete member types."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(_members(arg))
        return out
    return [annotation]


def _model_at(root: Any, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc`` (discriminator tags resolved)."""
    candidates = _members(root)
    for part in loc:
        models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
        if not models:
            return None
        tagged = [m for m in models if _tag(m) == part]
        if tagged:  # a discriminated-union tag in the location
            candidates = tagged
            continue
        nxt: list[Any] = []
        for m in models:
            field = m.model_fields.get(part) if isinstance(part, str) else None
            if field is not None:
                nxt.extend(_members(field.annotation))
        if not nxt:
            return None
        candidates = nxt
    models = [c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)]
    return models[0] if len(models) == 1 else None


def _tag(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("name")
    if field is None:
        return None
    args = typing.get_args(field.annotation)
    return args[0] if len(args) == 1 else None


def explain(exc: ValidationError, root: Any, prefix: str = "") -> str:
    """One line per error: ``path: problem (fix)``."""
    return "\n".join(f"{path}: {problem}" for path, problem in explain_errors(exc, root, prefix))


def explain_errors(exc: ValidationError, root: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted path, problem and fix)`` per error, the path as a user writes it."""
    out = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        # Drop discriminator tags from the displayed path: users never write them.
        shown = [str(p) for i, p in enumerate(loc) if not _is_tag(root, loc[:i], p)]
        path = ".".join(([prefix] if prefix else []) + shown) or (prefix or "config")
        kind = err["type"]
        if kind == "extra_forbidden":
            parent = _model_at(root, loc[:-1])
            valid = sorted(parent.model_fields) if parent is not None else []
            hint = _did_you_mean(str(loc[-1]), valid)
            listing = f"valid keys here: {', '.join(valid)}" if valid else ""
            out.append((path, "unknown key. " + " ".join(x for x in (hint, listing) if x)))
        elif kind == "union_tag_invalid":
            ctx = err.get("ctx") or {}
            key = str(ctx.get("discriminator", "name")).strip("'\"")
            tag = str(ctx.get("tag", ""))
            valid = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
            hint = _did_you_mean(tag, valid)
            out.append((f"{path}.{key}", f"unknown {key} {tag!r}" + (f"; {hint}" if hint else ".")
                        + f" Choose from: {', '.join(valid)}"))
        elif kind == "value_error":  # our own validators: the message is the whole story
            out.append((path, str(err["msg"]).removeprefix("Value error, ")))
        else:
            got = err.get("input")
            if isinstance(got, bool) and kind.startswith(("int_", "float_")):
                got_s = f" (got {str(got).lower()}: a boolean where a number is expected)"
            else:
                got_s = "" if isinstance(got, dict) else f" (got {got!r})"
            out.append((path, f"{err['msg']}{got_s}"))
    return out


def _did_you_mean(word: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(word, valid, n=1, cutoff=0.5)
    return f"did you mean '{close[0]}'?" if close else ""


def _is_tag(root: Any, loc: tuple[Any, ...], part: Any) -> bool:
    parent_members = _members(root) if not loc else None
    if parent_members is None:
        model = _model_at(root, loc[:-1]) if len(loc) >= 1 else None
        field = model.model_fields.get(loc[-1]) if model is not None else None
        parent_members = _members(field.annotation) if field is not None else []
    models = [c for c in parent_members if isinstance(c, type) and issubclass(c, BaseModel)]
    return len(models) > 1 and any(_tag(m) == part for m in models)
