"""Splitting a chunk of prompt groups over the data-parallel ranks.

The unit of work is one completion (one sequence in a forward pass), not one
group: a chunk of 4 groups still splits evenly over 8 ranks. A rank's share is
the chunk's groups with every completion of another rank emptied - the group
keeps its rewards, so each rank computes the same group-relative advantages,
and :func:`asyncrl.trainers.packing.flatten` skips empty completions (they
carry no token, hence no loss and no gradient). So summing the ranks' token
sums gives exactly the chunk's sum, whatever the split.

Completions are placed longest first on the rank with the fewest tokens so far
(ties: the lowest rank): deterministic, and within one sequence's length of
balanced.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Sequence

from asyncrl.types import Rollout


def completion_cost(rollout: Rollout, index: int) -> int:
    """Tokens one completion puts through the model: its prompt and itself."""
    result = rollout.result
    return len(result.prompt_ids) + len(result.completion_ids[index])


def assign(rollouts: Sequence[Rollout], world_size: int) -> list[list[tuple[int, int]]]:
    """``(group index, completion index)`` pairs of each rank, in chunk order."""
    work = [(completion_cost(r, j), i, j)
            for i, r in enumerate(rollouts)
            for j, c in enumerate(r.result.completion_ids) if c]
    work.sort(key=lambda w: (-w[0], w[1], w[2]))
    loads = [(0, rank) for rank in range(world_size)]
    shares: list[list[tuple[int, int]]] = [[] for _ in range(world_size)]
    for cost, i, j in work:
        load, rank = heapq.heappop(loads)
        shares[rank].append((i, j))
        heapq.heappush(loads, (load + cost, rank))
    return [sorted(share) for share in shares]


def split_chunk(rollouts: Sequence[Rollout], world_size: int) -> list[list[Rollout]]:
    """Each rank's share of ``rollouts``: every group, with only the rank's own
    completions left non-empty (see the module docstring)."""
    shares = []
    for pairs in assign(rollouts, world_size):
        mine: dict[int, set[int]] = {}
        for i, j in pairs:
            mine.setdefault(i, set()).add(j)
        shares.append([_keep(r, mine.get(i, set())) for i, r in enumerate(rollouts)])
    return shares


def _keep(rollout: Rollout, keep: set[int]) -> Rollout:
    result = rollout.result
    if len(keep) == len(result.completion_ids):
        return rollout
    # An emptied completion keeps its finish reason (loss.truncated: zero_reward
    # reads it for the group's advantages), and loses its tokens.
    emptied = dataclasses.replace(result, completions=[
        c if j in keep else dataclasses.replace(c, token_ids=[], logprobs=[], versions=(),
                                                 loss_mask=None)
        for j, c in enumerate(result.completions)])
    return dataclasses.replace(rollout, result=emptied)


__all__ = ["assign", "completion_cost", "split_chunk"]
