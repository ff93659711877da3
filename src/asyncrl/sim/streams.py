"""Seeded random streams of the simulator's components.

Each component (first-attempt latencies, retries, failure and filter coins, each
workload phase) draws from a stream of its own, seeded from the run seed and its
name, so switching one component changes no other's numbers (common random
numbers across the policies a comparison runs).
"""

from __future__ import annotations

import random
from typing import Any

# How many latencies are drawn per refill of a stream: amortises the call overhead.
DRAW_BATCH = 4096


def component_rng(seed: int, component: str) -> random.Random:
    """An independent stream per component, from the run seed (string seeds are
    hashed with SHA-512 by ``random``, so this is stable across processes)."""
    return random.Random(f"asyncrl-sim:{seed}:{component}")


class Stream:
    """A seeded stream of latencies or coin flips, addressable by index."""

    __slots__ = ("_draw", "_rng", "values")

    def __init__(self, rng: random.Random, draw: Any) -> None:
        self._rng = rng
        self._draw = draw
        self.values: list[Any] = []

    def at(self, index: int) -> Any:
        values = self.values
        while index >= len(values):
            values.extend(self._draw(self._rng, DRAW_BATCH))
        return values[index]


def uniforms(rng: random.Random, k: int) -> list[float]:
    """``k`` uniform draws in [0, 1): the coin flips of a :class:`Stream`."""
    uniform = rng.random
    return [uniform() for _ in range(k)]


__all__ = ["DRAW_BATCH", "Stream", "component_rng", "uniforms"]
