"""Wording helpers for messages."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, in the plural unless ``count`` is 1: "1 step",
    "2 steps" (``many``: the plural where it is not ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


def qualified_name(obj: object) -> str:
    """``obj``'s class as ``module.QualName``: how messages name a component."""
    cls = type(obj)
    return f"{cls.__module__}.{cls.__qualname__}"


__all__ = ["plural", "qualified_name"]
