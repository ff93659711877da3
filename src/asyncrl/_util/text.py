"""Wording helpers for messages."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` and ``noun``, in the plural unless ``count`` is 1: "1 step",
    "2 steps" (``many``: the plural where it is not ``noun + "s"``)."""
    return f"{count} {noun if count == 1 else many or noun + 's'}"


__all__ = ["plural"]
