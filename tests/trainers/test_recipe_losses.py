"""The recipe variants of the loss (issue 31) on hand-computed numbers: advantages
(leave-one-out, no std), aggregation weights, GSPO's sequence ratio, the dual
clip, the KL estimators and DAPO's overlong penalty."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config import LossConfig
from asyncrl.trainers.advantages import advantages, step_advantages
from asyncrl.trainers.losses import Sequences, clipped_surrogate, kl_penalty, token_losses
from asyncrl.trainers.masks import overlong_penalty, training_rewards
from asyncrl.trainers.packing import aggregated
from asyncrl.types import Completion, GroupResult, Prompt, Rollout

log = math.log


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


# --------------------------------------------------------------- advantages
def test_leave_one_out_baseline_is_the_mean_of_the_others():
    rewards = t(1, 0, 0, 0)
    # r_i - mean(r_j, j != i): 1 - 0, 0 - 1/3 (three times)
    rloo = advantages(rewards, LossConfig(baseline="leave_one_out", scale="none"))
    assert torch.allclose(rloo, t(1, -1 / 3, -1 / 3, -1 / 3))
    # Dr. GRPO: centred, not divided
    assert torch.allclose(advantages(rewards, LossConfig(scale="none")),
                          t(0.75, -0.25, -0.25, -0.25))
    # GRPO: divided by the population std, sqrt(3) / 4
    grpo = advantages(rewards, LossConfig())
    assert torch.allclose(grpo, t(0.75, -0.25, -0.25, -0.25) / (math.sqrt(3) / 4 + 1e-6))
    scaled = advantages(rewards, LossConfig(baseline="leave_one_out"))
    assert torch.allclose(scaled, rloo / (math.sqrt(3) / 4 + 1e-6))
    equal = advantages(t(0.5, 0.5, 0.5), LossConfig(baseline="leave_one_out"))
    assert torch.equal(equal, t(0, 0, 0))


def test_batch_scale_divides_by_the_std_of_the_whole_step():
    groups = [t(1, 0), t(1, 1, 0, 0)]  # all six rewards: population std 0.5
    adv = step_advantages(groups, LossConfig(scale="batch"))
    assert torch.allclose(adv[0], t(1, -1), atol=1e-5)
    assert torch.allclose(adv[1], t(1, 1, -1, -1), atol=1e-5)
    # per group, the first group's std would be 0.5 too, the second's 0.5: same;
    # a group of equal rewards gets 0 either way, but its rewards count in the std
    adv = step_advantages([t(1, 0), t(1, 1)], LossConfig(scale="batch"))
    std = t(1, 0, 1, 1).std(correction=0).item()
    assert torch.allclose(adv[0], t(0.5, -0.5) / (std + 1e-6)) and not adv[1].any()


# -------------------------------------------------------------- aggregation
def test_aggregation_weights_and_normaliser_shares():
    mask = [1.0, 0.0, 1.0, 1.0]
    assert aggregated(mask, LossConfig(), 8) == (mask, 3.0)
    weights, share = aggregated(mask, LossConfig(aggregation="sequence_mean"), 8)
    assert weights == pytest.approx([1 / 3, 0, 1 / 3, 1 / 3]) and share == 1.0
    assert aggregated(mask, LossConfig(aggregation="constant"), 8) == (mask, 8.0)
    # a completion with nothing to train adds nothing to any normaliser
    assert aggregated([0.0, 0.0], LossConfig(aggregation="sequence_mean"), 8) == ([0.0, 0.0], 0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        aggregated(mask, LossConfig(aggregation="constant"), None)


# --------------------------------------------------------------- dual clip
def test_dual_clip_caps_negative_advantage_losses():
    # NeMo-RL's own numbers: A = [1, -1, -4], r = [0.5, 1, 10], c = 3.
    ratio = t(0.5, 1.0, 10.0).requires_grad_(True)
    adv = t(1, -1, -4)
    loss, clipped = clipped_surrogate(ratio, adv, 0.2, 0.2, dual_clip=3.0)
    assert torch.allclose(loss, t(-0.5, 1.0, 12.0))
    loss.sum().backward()
    # gradient -A where the surrogate is live, 0 where the dual clip binds
    assert torch.allclose(ratio.grad, t(-1.0, 1.0, 0.0))
    assert clipped.tolist() == [False, False, True]
    plain, _ = clipped_surrogate(ratio.detach(), adv, 0.2, 0.2)
    assert plain[2] == pytest.approx(40.0)


# ----------------------------------------------------------------- GSPO
def test_sequence_ratio_is_the_geometric_mean_over_trained_tokens():
    # Two sequences: tokens 0-2 (token 1 not trained) and 3-4.
    behavior = t(log(0.5), log(0.5), log(0.5), log(0.4), log(0.4))
    logp = t(log(0.6), log(0.1), log(0.54), log(0.4), log(0.2))
    trained = t(1, 0, 1, 1, 1)
    seqs = Sequences(torch.tensor([0, 0, 0, 1, 1]), 2, trained)
    adv = t(1, 1, 1, -1, -1)
    cfg = LossConfig(ratio_level="sequence", clip_eps=0.2)
    lp = logp.clone().requires_grad_(True)
    loss, clipped, _, _ = token_losses(cfg, lp, behavior, adv, seqs=seqs)
    s0 = math.sqrt(1.2 * 1.08)  # token 1 (ratio 0.2) left out
    s1 = math.sqrt(1.0 * 0.5)
    assert torch.allclose(loss, t(-s0, -s0, -s0, 0.8, 0.8), atol=1e-6)  # s1 < 0.8, A < 0: clipped
    assert clipped.tolist() == [False, False, False, True, True]
    (loss * trained).sum().backward()
    # d(-s0 A)/d logp_t = -A s0 / |T| per trained token, times the 2 trained copies
    g = -s0 / 2 * 2
    assert torch.allclose(lp.grad, t(g, 0.0, g, 0.0, 0.0), atol=1e-6)
    assert s1 < 0.8


def test_sequence_level_tis_weight_is_per_sequence():
    behavior = t(log(0.25), log(0.5))
    prox = t(log(0.5), log(0.5))  # token weights 2 and 1: geometric mean sqrt(2)
    seqs = Sequences(torch.tensor([0, 0]), 1, t(1, 1))
    cfg = LossConfig(ratio_level="sequence", off_policy_correction="tis", is_cap=None)
    loss, _, weights, _ = token_losses(cfg, prox.clone(), behavior, t(1, 1), prox=prox,
                                       seqs=seqs)
    assert torch.allclose(weights, t(math.sqrt(2), math.sqrt(2)))
    assert torch.allclose(loss, -weights)


# ------------------------------------------------------------------ mismatch
def test_mismatch_drop_rejects_tokens_or_sequences_outside_the_bounds():
    behavior = t(log(0.25), log(0.8), log(0.5), log(0.5))
    prox = t(log(0.5), log(0.2), log(0.5), log(0.6))  # rho = 2, 0.25, 1, 1.2
    seqs = Sequences(torch.tensor([0, 0, 1, 1]), 2, t(1, 1, 1, 1))
    adv = t(1, 1, 1, 1)
    token = LossConfig(off_policy_correction="decoupled",
                       mismatch={"level": "token", "mode": "drop", "upper": 1.5})
    lp = prox.clone().requires_grad_(True)
    loss, _, _, dropped = token_losses(token, lp, behavior, adv, prox=prox, seqs=seqs)
    assert dropped.tolist() == [True, True, False, False]  # outside [1/1.5, 1.5]
    loss.sum().backward()
    assert torch.allclose(loss, t(0, 0, -1.0, -1.2)) and lp.grad[:2].abs().sum() == 0
    # sequence level: geometric means sqrt(2 x 0.25) = 0.71 (kept), sqrt(1.2) (kept)
    seq = token.model_copy(update={"mismatch": token.mismatch.model_copy(
        update={"level": "sequence"})})
    _, _, _, dropped = token_losses(seq, prox.clone(), behavior, adv, prox=prox, seqs=seqs)
    assert dropped.tolist() == [False, False, False, False]
    tight = seq.model_copy(update={"mismatch": seq.mismatch.model_copy(update={"upper": 1.05})})
    _, _, _, dropped = token_losses(tight, prox.clone(), behavior, adv, prox=prox, seqs=seqs)
    assert dropped.tolist() == [True, True, True, True]  # 0.71 and 1.095 outside [0.95, 1.05]


def test_mismatch_truncate_bounds_the_behaviour_weight_on_both_sides():
    behavior = t(log(0.25), log(0.8), log(0.5))
    prox = t(log(0.5), log(0.2), log(0.5))  # rho = 2, 0.25, 1
    cfg = LossConfig(off_policy_correction="tis",
                     mismatch={"level": "token", "mode": "truncate", "lower": 0.5, "upper": 1.5})
    loss, _, _, dropped = token_losses(cfg, prox.clone(), behavior, t(1, 1, 1), prox=prox)
    assert torch.allclose(loss, t(-1.5, -0.5, -1.0)) and not dropped.any()


# ----------------------------------------------------------------------- KL
def test_kl_estimators_clamps_and_on_policy_weight():
    logp, ref = t(log(0.5), log(0.3)), t(log(0.25), log(0.3))
    d = log(0.5)
    behavior = t(log(0.25), log(0.3))  # pi / mu = 2, 1
    for name, value in [("k1", -d), ("k2", d * d / 2), ("k3", math.exp(d) - 1 - d)]:
        kl = kl_penalty(LossConfig(kl_coef=0.1, kl_estimator=name), logp, ref, logp)
        assert torch.allclose(kl, t(value, 0.0)), name
        weighted = kl_penalty(LossConfig(kl_coef=0.1, kl_estimator=name,
                                         on_policy_kl_approximation=True), logp, ref, behavior)
        assert torch.allclose(weighted, t(2 * value, 0.0)), name
    far = kl_penalty(LossConfig(kl_coef=0.1, kl_estimator="k1", kl_input_clamp=0.5,
                                kl_output_clamp=0.4), t(0.0), t(-3.0), t(0.0))
    assert far.item() == pytest.approx(0.4)  # d clamped to -0.5, k1 = 0.5, then to 0.4


# ------------------------------------------------------------------ overlong
def test_overlong_penalty_matches_nemo_rls_numbers():
    # NeMo-RL's test: lengths [10, 22, 25, 30], L_max 25, buffer 5, penalty 0.5.
    shaped = [r + overlong_penalty(n, limit=25, buffer=5, penalty=0.5)
              for n, r in zip([10, 22, 25, 30], [1.0, 0.8, 0.6, 0.4])]
    assert shaped == pytest.approx([1.0, 0.6, 0.1, -0.6])


def test_overlong_shaping_reaches_the_advantages_rewards():
    comps = [Completion.of([7] * n, [-1.0] * n, [0] * n, "stop") for n in (2, 6, 8)]
    r = Rollout("g", Prompt(0, "1+2="), GroupResult("g", [1], comps, 0), [1.0, 1.0, 1.0])
    cfg = LossConfig(overlong={"buffer_tokens": 4, "penalty": 1.0})
    # limit 8 (max_new_tokens): 0 up to 4 tokens, -0.5 at 6, -1 at 8
    assert training_rewards(r, cfg, max_new_tokens=8) == pytest.approx([1.0, 0.5, 0.0])
    fixed = LossConfig(overlong={"buffer_tokens": 4, "max_tokens": 6})
    # limit 6: 0 up to 2 tokens, -1 at 6, -1.5 at 8 (no floor beyond the limit)
    assert training_rewards(r, fixed, max_new_tokens=8) == pytest.approx([1.0, 0.0, -0.5])
    assert training_rewards(r, LossConfig(), max_new_tokens=8) == [1.0, 1.0, 1.0]


def test_reward_scaling_maps_the_task_rewards_before_the_overlong_penalty():
    """NeMo-RL's grpo.reward_scaling and its order: clamp to the source range, map
    linearly onto the target range, then add the length penalty."""
    comps = [Completion.of([7] * n, [-1.0] * n, [0] * n, "stop") for n in (2, 2, 6, 2)]
    r = Rollout("g", Prompt(0, "1+2="), GroupResult("g", [1], comps, 0), [0.0, 0.25, 1.0, 3.0])
    scaling = {"source_min": 0.0, "source_max": 1.0, "target_min": -1.0, "target_max": 1.0}
    cfg = LossConfig(reward_scaling=scaling)
    assert training_rewards(r, cfg, max_new_tokens=8) == pytest.approx([-1.0, -0.5, 1.0, 1.0])
    both = LossConfig(reward_scaling=scaling, overlong={"buffer_tokens": 4})
    # 6 tokens of 8 with a buffer of 4: -0.5 after the scaled 1.0
    assert training_rewards(r, both, max_new_tokens=8) == pytest.approx([-1.0, -0.5, 0.5, 1.0])
