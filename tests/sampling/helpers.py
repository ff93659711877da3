"""Shared scaffolding for the sampler tests: the policy variants and twin states."""

from __future__ import annotations

import itertools
import random
from typing import Any

from asyncrl.buffer import RolloutBuffer
from asyncrl.sampling import BaseSampler, create_sampler

from .reference import ReferenceModel

# Unique across every state built in one test session.
_group_ids = (f"g{i}" for i in itertools.count())

# (policy, window, sample_freshest_first): every built-in, several windows,
# both orders of windowed.
VARIANTS: list[tuple[str, int, bool]] = [
    ("in_order", 0, False),
    ("in_order", 1, False),
    ("in_order", 3, False),
    ("weight_fifo", 0, False),
    ("weight_fifo", 1, False),
    ("weight_fifo", 3, False),
    ("windowed", 0, False),
    ("windowed", 2, False),
    ("windowed", 2, True),
    ("ready_first", 0, False),
    ("ready_first", 2, False),
]


# The same, measuring staleness by end_weight (staleness_of): an optional fourth element.
END_WEIGHT_VARIANTS: list[tuple[str, int, bool, str]] = [
    ("weight_fifo", 0, False, "end_weight"),
    ("weight_fifo", 2, False, "end_weight"),
    ("windowed", 0, False, "end_weight"),
    ("windowed", 2, False, "end_weight"),
    ("windowed", 2, True, "end_weight"),
]


def variant_id(variant: tuple) -> str:
    policy, window, fresh, *measure = variant
    return (f"{policy}-s{window}" + ("-freshest" if fresh else "")
            + ("-end" if measure == ["end_weight"] else ""))


def make_twins(
    variant: tuple, capacity: int
) -> tuple[RolloutBuffer, BaseSampler, ReferenceModel]:
    """Our buffer and sampler, and a reference model of the same policy, both empty."""
    policy, window, fresh, *measure = variant
    ref = ReferenceModel(policy, window, capacity=capacity, freshest_first=fresh,
                         staleness_of=measure[0] if measure else "start_weight")
    buf = RolloutBuffer(capacity)
    sampler = create_sampler(buf, ref.config())
    assert isinstance(sampler, BaseSampler)
    return buf, sampler, ref


def populate(
    rng: random.Random,
    buf: RolloutBuffer,
    ref: ReferenceModel,
    *,
    count: int,
    max_weight: int = 6,
    ready_fraction: float = 0.7,
) -> None:
    """Reserve ``count`` groups in both, with random weights and stamps, and commit most.

    Uses ``reserve_nowait`` so that it runs outside an event loop; ``count``
    must fit the capacity.
    """
    stamped = ref.policy == "in_order"
    for _ in range(count):
        gid = next(_group_ids)
        weight = rng.randrange(max_weight + 1)
        target = rng.randrange(max_weight + 2) if stamped else None
        buf.reserve_nowait(gid, start_weight=weight, target_step=target)
        ref.reserve(gid, weight, target)
        if rng.random() < ready_fraction:
            end = weight + rng.randrange(2)
            buf.commit(gid, payload=gid, end_weight=end)
            ref.commit(gid, payload=gid, end_weight=end)


def describe(slots: Any) -> list[tuple[Any, int, int | None, bool]]:
    """What the two models must agree on, slot by slot, in dispatch order."""
    return [(s.group_id, s.start_weight, s.target_step, s.ready) for s in slots]
