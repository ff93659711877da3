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

from pydantic import BaseModel, Tag, ValidationError


def annotation_members(annotation: Any) -> list[Any]:
    """Flatten Annotated/Union/Optional into the concrete member types."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return annotation_members(typing.get_args(annotation)[0])
    if origin in (Union, types.UnionType):
        out: list[Any] = []
        for arg in typing.get_args(annotation):
            out.extend(annotation_members(arg))
        return out
    return [annotation]


def _callable_tags(annotation: Any) -> dict[str, Any]:
    """``Tag`` name -> the member it marks, in a union with a callable
    discriminator (pydantic puts such a tag in an error's location)."""
    found: dict[str, Any] = {}
    if typing.get_origin(annotation) is typing.Annotated:
        inner, *meta = typing.get_args(annotation)
        found.update({m.tag: inner for m in meta if isinstance(m, Tag)})
        found.update(_callable_tags(inner))
    elif typing.get_origin(annotation) in (Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found.update(_callable_tags(arg))
    return found


def _step(annotation: Any, part: Any) -> tuple[Any, bool] | None:
    """The annotation of the value ``part`` names inside one of ``annotation``,
    and whether ``part`` is a tag (a location part users never write)."""
    tags = _callable_tags(annotation)
    if isinstance(part, str) and part in tags:
        return tags[part], True
    members = annotation_members(annotation)
    if isinstance(part, int):
        items = [typing.get_args(m)[0] for m in members if typing.get_origin(m) is list]
        return (items[0], False) if len(items) == 1 else None
    models = [c for c in members if isinstance(c, type) and issubclass(c, BaseModel)]
    named = [m for m in models if _tag(m) == part]
    if len(models) > 1 and named:  # a `name`-discriminated block (task, sampler, ...)
        return named[0], True
    fields = [m.model_fields[part].annotation for m in models if part in m.model_fields]
    return (fields[0], False) if fields else None


def _walk(root: Any, loc: tuple[Any, ...]) -> tuple[list[str], Any]:
    """The parts of ``loc`` a user writes, and the annotation at ``loc`` (None
    where the location leaves the schema)."""
    shown: list[str] = []
    annotation: Any = root
    for part in loc:
        step = _step(annotation, part) if annotation is not None else None
        if step is None:
            annotation = None
            shown.append(str(part))
            continue
        annotation, is_tag = step
        if not is_tag:
            shown.append(str(part))
    return shown, annotation


def _model_at(root: Any, loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model class whose fields live at ``loc``."""
    annotation = _walk(root, loc)[1]
    if annotation is None:
        return None
    models = [c for c in annotation_members(annotation)
              if isinstance(c, type) and issubclass(c, BaseModel)]
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
        shown = _walk(root, loc)[0]
        path = ".".join(([prefix] if prefix else []) + shown) or (prefix or "config")
        kind = err["type"]
        if kind == "extra_forbidden":
            parent = _model_at(root, loc[:-1])
            valid = sorted(parent.model_fields) if parent is not None else []
            hint = _missing_space(str(loc[-1]), valid) or _did_you_mean(str(loc[-1]), valid)
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
        elif kind == "literal_error" and isinstance(err.get("input"), str):
            # A name from a fixed set (policy.engine, ...): the closest one, as a
            # sampler or task name gets.
            valid = re.findall(r"'([^']*)'", str((err.get("ctx") or {}).get("expected", "")))
            hint = _did_you_mean(err["input"], valid)
            out.append((path, f"{err['msg']} (got {err['input']!r})" + (f"; {hint}" if hint
                                                                      else "")))
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


def _missing_space(word: str, valid: list[str]) -> str:
    """``{r:4}`` is YAML's mapping of the key ``r:4`` (to null): a flow mapping
    needs a space after the colon. Said when the text before the colon is a key."""
    name, colon, value = word.partition(":")
    if not colon or name.strip() not in valid:
        return ""
    return (f"'{word}' is one key: YAML needs a space after the colon in a flow mapping, "
            f"write {{{name.strip()}: {value.strip()}}}.")
