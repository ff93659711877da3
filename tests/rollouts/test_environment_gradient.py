"""The loss ignores environment tokens: perturbing what a rollout function's
environment added (``loss_mask`` 0) leaves the trainer's gradient exactly
unchanged, while perturbing a policy token changes it."""

from __future__ import annotations

import copy
import dataclasses
import functools

import pytest
import torch

from asyncrl.config import LossConfig
from asyncrl.trainers import GRPOTrainer
from asyncrl.types import Completion, Rollout
from tests.trainers.shapes import small_policy, synthetic_rollouts

pytest.importorskip("transformers")

LENGTHS = [[12, 9, 14], [10, 13, 7]]
#: Per completion: (start, end) of its environment tokens - a tool's output in
#: the middle (the policy goes on after it) and one at the very end.
ENV = {(0, 0): [(4, 7)], (0, 2): [(5, 8), (11, 14)], (1, 1): [(2, 4), (10, 13)]}


def with_environment(rollouts: list[Rollout]) -> list[Rollout]:
    for (g, i), spans in ENV.items():
        c = rollouts[g].result.completions[i]
        mask = [1] * len(c)
        for start, end in spans:
            mask[start:end] = [0] * (end - start)
        rollouts[g].result.completions[i] = dataclasses.replace(c, loss_mask=mask)
    return rollouts


def edited(rollouts: list[Rollout], g: int, i: int, *, ids=None, logprobs=None) -> list[Rollout]:
    c = rollouts[g].result.completions[i]
    rollouts[g].result.completions[i] = Completion(
        list(ids or c.token_ids), list(logprobs or c.logprobs), c.versions, c.finish_reason,
        c.text, c.loss_mask)
    return rollouts


@functools.cache
def _policy():
    return small_policy(0)


def gradient(rollouts: list[Rollout]) -> torch.Tensor:
    model, tok = _policy()
    model = copy.deepcopy(model)  # the same weights for every gradient
    trainer = GRPOTrainer(model, tok, num_threads=1, micro_batch_tokens=64, loss_chunk_tokens=7,
                          loss=LossConfig(off_policy_correction="decoupled", is_cap=2.0))
    trainer.train_chunk_sync(rollouts)
    return torch.cat([m.grad.flatten() for m in trainer.params if m.grad is not None])


def data() -> list[Rollout]:
    return with_environment(synthetic_rollouts(LENGTHS, vocab=300))


def test_environment_tokens_never_change_the_gradient_and_policy_tokens_do() -> None:
    reference = gradient(data())
    assert reference.abs().sum() > 0

    # Every environment token's behaviour log-prob changed.
    perturbed = data()
    for (g, i), spans in ENV.items():
        lp = list(perturbed[g].result.completions[i].logprobs)
        for start, end in spans:
            lp[start:end] = [-9.0 + 0.5 * k for k in range(end - start)]
        edited(perturbed, g, i, logprobs=lp)
    assert torch.equal(gradient(perturbed), reference)

    # The ids of environment tokens that end a transcript (nothing is conditioned on them).
    perturbed = data()
    for (g, i) in [(0, 2), (1, 1)]:
        ids = list(perturbed[g].result.completions[i].token_ids)
        start, end = ENV[(g, i)][-1]
        ids[start:end] = [(t + 17) % 290 + 3 for t in ids[start:end]]
        edited(perturbed, g, i, ids=ids)
    assert torch.equal(gradient(perturbed), reference)

    # A policy token's behaviour log-prob, or its id: the gradient moves.
    lp = list(data()[0].result.completions[2].logprobs)
    lp[9] -= 1.0
    assert not torch.equal(gradient(edited(data(), 0, 2, logprobs=lp)), reference)
    ids = list(data()[0].result.completions[2].token_ids)
    ids[9] = (ids[9] + 17) % 290 + 3
    assert not torch.equal(gradient(edited(data(), 0, 2, ids=ids)), reference)
