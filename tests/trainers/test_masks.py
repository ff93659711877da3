"""Token masks: which tokens a step learns from (loss_mask, loss.max_token_staleness,
loss.truncated), and that the trainer gives excluded tokens no gradient and no
place in the token mean."""

from __future__ import annotations

import copy

import pytest
import torch
from tests.trainers.test_grpo import policy

from asyncrl.config import LossConfig
from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.losses import group_advantages
from asyncrl.trainers.masks import MaskStats, token_masks, training_rewards
from asyncrl.types import Completion, GroupResult, Prompt, Rollout

pytest.importorskip("transformers")


def rollout(completions: list[Completion], rewards: list[float], start: int = 0) -> Rollout:
    result = GroupResult("g", [1, 5, 6], completions, start)
    return Rollout("g", Prompt(0, "1+2="), result, rewards)


def test_masks_follow_the_record_the_bound_and_the_truncation_rule():
    r = rollout([Completion.of([7, 8, 9, 10], [-1.0] * 4, [2, 3, 5, 5], "stop",
                               loss_mask=[1, 0, 1, 1]),
                 Completion.of([7, 8], [-1.0] * 2, [4, 4], "length")], [1.0, 0.5])
    stats = MaskStats()
    masks = token_masks(r, step=6, cfg=LossConfig(max_token_staleness=2), stats=stats)
    # step 6, bound 2: versions 2 and 3 are too old (6 - 3 > 2); version 4 is not.
    assert masks == [[0.0, 0.0, 1.0, 1.0], [1.0, 1.0]]
    assert stats.metrics() == {"masked_token_frac": 2 / 6, "truncated_frac": 0.5}
    assert token_masks(r, step=6, cfg=LossConfig()) == [[1.0, 0.0, 1.0, 1.0], [1.0, 1.0]]
    masked = token_masks(r, step=6, cfg=LossConfig(truncated="mask"))
    assert masked == [[1.0, 0.0, 1.0, 1.0], [0.0, 0.0]]
    assert training_rewards(r, LossConfig()) == [1.0, 0.5]
    assert training_rewards(r, LossConfig(truncated="zero_reward")) == [1.0, 0.0]


def accumulated_gradient(trainer: GRPOTrainer,
                         data: list[Rollout]) -> tuple[torch.Tensor, dict[str, float]]:
    """The step's gradient as finish_step would apply it: the sum over the counted
    tokens divided by their number."""
    metrics = trainer.train_chunk_sync(data)
    grad = torch.cat([p.grad.flatten() for p in trainer.params])
    trainer.optimizer.zero_grad(set_to_none=True)
    tokens = trainer._step.weight  # the step's token count: its counted tokens
    trainer._step = type(trainer._step)()
    metrics["step_tokens"] = tokens
    return grad / tokens, metrics


def test_excluded_tokens_get_no_gradient_and_do_not_count():
    """At step 5 with loss.max_token_staleness 2, a completion's first tokens
    (version 1) are excluded: the step's gradient is, by hand, the mean over the
    counted tokens only of the policy gradient, and changing the excluded
    tokens' behaviour log-probs changes nothing."""
    model, tok = policy()
    ids = [5, 6, 7, 8, 9, 10]
    rng = torch.Generator().manual_seed(0)
    lps = (-torch.rand(6, generator=rng)).tolist()
    versions = [1, 1, 1, 4, 4, 4]

    def data(head_logprob: float) -> list[Rollout]:
        completions = [Completion.of(ids, [head_logprob] * 3 + lps[3:], versions, "stop"),
                       Completion.of(ids[:3], lps[:3], [4, 4, 4], "stop")]
        return [rollout(completions, [1.0, 0.0])]

    def trainer(bound: int | None) -> GRPOTrainer:
        t = GRPOTrainer(copy.deepcopy(model), tok, num_threads=1,
                        loss=LossConfig(max_token_staleness=bound, off_policy_correction="tis"))
        t.version = 5  # the step that trains them
        return t

    masked, metrics = accumulated_gradient(trainer(2), data(-0.3))
    perturbed, _ = accumulated_gradient(trainer(2), data(-3.0))
    assert torch.equal(masked, perturbed)
    assert metrics["step_tokens"] == 6 and metrics["masked_token_frac"] == pytest.approx(3 / 9)

    # By hand: tis's gradient is -min(pi/mu, cap) * A * grad log pi per counted token.
    ref = copy.deepcopy(model)
    adv = group_advantages(torch.tensor([1.0, 0.0]))
    total = torch.zeros(())
    for seq, behavior, a, keep in ((ids, lps, adv[0], slice(3, 6)), (ids[:3], lps[:3], adv[1],
                                                                      slice(0, 3))):
        logits = ref(input_ids=torch.tensor([[1, 5, 6, *seq]])).logits[0, 2:-1]
        logp = torch.log_softmax(logits, -1).gather(1, torch.tensor(seq)[:, None])[:, 0]
        w = torch.exp(logp.detach() - torch.tensor(behavior)).clamp(max=2.0)
        total = total - (w * a * logp)[keep].sum()
    (total / 6).backward()
    by_hand = torch.cat([p.grad.flatten() for p in ref.parameters() if p.requires_grad])
    assert torch.allclose(masked, by_hand, atol=1e-6)
    unbounded, _ = accumulated_gradient(trainer(None), data(-0.3))
    assert not torch.allclose(unbounded, masked, atol=1e-4)  # the bound did something


def test_truncated_completions_masked_or_trained_with_reward_zero():
    model, tok = policy()
    cut = Completion.of([5, 6, 7], [-0.5] * 3, 0, "length")
    ended = Completion.of([5, 8], [-0.5] * 2, 0, "stop")
    data = [rollout([cut, ended], [1.0, 0.0])]
    metrics = {}
    for mode in ("keep", "mask", "zero_reward"):
        t = GRPOTrainer(copy.deepcopy(model), tok, num_threads=1, loss=LossConfig(truncated=mode))
        _, metrics[mode] = accumulated_gradient(t, data)
    assert metrics["keep"]["truncated_frac"] == 0.5
    assert metrics["keep"]["step_tokens"] == 5 and metrics["mask"]["step_tokens"] == 2
    assert metrics["mask"]["masked_token_frac"] == pytest.approx(3 / 5)
    # Rewards (1, 0) give advantages (+1, -1); zero_reward makes them (0, 0): no signal.
    assert metrics["keep"]["advantage_abs_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["zero_reward"]["advantage_abs_mean"] == 0.0
