"""Splitting a chunk over ranks: balanced by tokens, nothing lost or doubled."""

from __future__ import annotations

import pytest

from asyncrl.config import LossConfig
from asyncrl.trainers.distributed.split import assign, completion_cost, split_chunk
from asyncrl.trainers.packing import flatten

from .helpers import config, fixed_rollouts

CFG = config()


@pytest.mark.parametrize("world_size", [1, 2, 3, 8])
def test_every_completion_goes_to_exactly_one_rank(world_size: int) -> None:
    rollouts = fixed_rollouts(CFG, 5, 6, seed=world_size)
    pairs = assign(rollouts, world_size)
    flat_pairs = sorted(p for share in pairs for p in share)
    assert flat_pairs == sorted((i, j) for i, r in enumerate(rollouts)
                                for j, c in enumerate(r.result.completion_ids) if c)
    shares = split_chunk(rollouts, world_size)
    assert len(shares) == world_size
    for share, mine in zip(shares, pairs):
        for i, (part, whole) in enumerate(zip(share, rollouts)):
            # Every rank sees every group's rewards: the same advantages everywhere.
            assert part.rewards == whole.rewards and part.group_id == whole.group_id
            for j, c in enumerate(part.result.completion_ids):
                expected = whole.result.completion_ids[j] if (i, j) in mine else []
                assert c == expected
                assert len(part.result.behavior_logprobs[j]) == len(expected)
    tokens = sum(len(s) for share in shares for s in flatten(share, loss=LossConfig(), step=0).seqs)
    assert tokens == sum(len(s) for s in flatten(rollouts, loss=LossConfig(), step=0).seqs)


def test_loads_are_balanced_within_one_sequence() -> None:
    rollouts = fixed_rollouts(CFG, 8, 8, seed=7)
    costs = [[completion_cost(rollouts[i], j) for i, j in share] for share in assign(rollouts, 4)]
    loads = [sum(c) for c in costs]
    assert max(loads) - min(loads) <= max(max(c) for c in costs if c)


def test_fewer_completions_than_ranks_leaves_empty_shares() -> None:
    one = fixed_rollouts(CFG, 1, 3, lengths=[0, 3, 0])
    shares = split_chunk(one, 2)
    counts = [len(flatten(s, loss=LossConfig(), step=0).seqs) for s in shares]
    assert sorted(counts) == [0, 1]
    empty = fixed_rollouts(CFG, 2, 2, lengths=[0, 0])
    assert all(not flatten(s, loss=LossConfig(), step=0).seqs for s in split_chunk(empty, 2))
