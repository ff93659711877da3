"""The GRPO math on hand-computed numbers."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.trainers.losses import (
    decoupled_loss,
    group_advantages,
    k3_kl,
    none_loss,
    normalized_ess,
    ppo_clip_loss,
    tis_loss,
)

log = math.log


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.float32)


def grad_of(loss_fn, logp: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-token loss, d loss_i / d logp_i) for a loss that is elementwise in logp."""
    logp = logp.clone().requires_grad_(True)
    loss, clipped = loss_fn(logp)
    loss.sum().backward()
    return loss.detach(), logp.grad, clipped


# --------------------------------------------------------------- advantages
def test_group_advantages_scaled_by_population_std():
    # mean 0.5, population std 0.5
    adv = group_advantages(t(1, 0, 0, 1))
    assert torch.allclose(adv, t(1, -1, -1, 1), atol=1e-5)
    # mean 0.5, std sqrt(1/6) = 0.408248...
    adv = group_advantages(t(0, 0.5, 1))
    assert torch.allclose(adv, t(-1.2247449, 0, 1.2247449), atol=1e-5)
    # one hit in eight: (1 - 1/8) / sqrt(1/8 * 7/8)
    adv = group_advantages(t(1, 0, 0, 0, 0, 0, 0, 0))
    assert adv[0] == pytest.approx(0.875 / math.sqrt(7 / 64), rel=1e-5)
    assert adv[1] == pytest.approx(-0.125 / math.sqrt(7 / 64), rel=1e-5)


def test_group_advantages_mean_centering_only():
    assert torch.allclose(group_advantages(t(1, 0, 0, 1), scale=False), t(0.5, -0.5, -0.5, 0.5))
    assert torch.allclose(group_advantages(t(0.2, 0.4), scale=False), t(-0.1, 0.1))


def test_equal_rewards_and_single_completion_give_zero_advantage():
    assert torch.equal(group_advantages(t(0.7, 0.7, 0.7)), t(0, 0, 0))
    assert torch.equal(group_advantages(t(0.3)), t(0))
    # along the last dimension for a [groups, n] tensor
    adv = group_advantages(torch.tensor([[1.0, 0.0], [0.5, 0.5]]))
    assert torch.allclose(adv, torch.tensor([[1.0, -1.0], [0.0, 0.0]]), atol=1e-5)


# ------------------------------------------------------------------ PPO clip
def test_ppo_clip_by_hand():
    old = t(0, 0, 0, 0, 0)
    # ratios 1.5, 0.5, 0.5, 1.5, 1.25 ; advantages +1, +1, -1, -1, +1 ; eps 0.2 / 0.28
    ratios = t(1.5, 0.5, 0.5, 1.5, 1.25)
    adv = t(1, 1, -1, -1, 1)
    loss, grad, clipped = grad_of(
        lambda lp: ppo_clip_loss(lp, old, adv, 0.2, 0.28), torch.log(ratios)
    )
    # -min(r A, clip(r) A): -min(1.5, 1.28) ; -min(.5, .8) ; -min(-.5, -.8) ; -min(-1.5, -1.2) ; -min(1.25, 1.25)
    assert torch.allclose(loss, t(-1.28, -0.5, 0.8, 1.5, -1.25))
    assert clipped.tolist() == [True, False, True, False, False]
    # d/dlogp of -r A = -r A where unclipped; 0 where the clip binds
    assert torch.allclose(grad, t(0, -0.5, 0, 1.5, -1.25))


def test_none_correction_is_ppo_against_behavior():
    behavior = t(log(0.25), log(0.5))
    logp = t(log(0.5), log(0.45))  # ratios 2.0 and 0.9
    adv = t(1.0, 1.0)
    loss, grad, clipped = grad_of(lambda lp: none_loss(lp, behavior, adv, 0.2, 0.2), logp)
    assert torch.allclose(loss, t(-1.2, -0.9))
    assert clipped.tolist() == [True, False]
    assert torch.allclose(grad, t(0.0, -0.9))


# ----------------------------------------------------------------------- TIS
def test_tis_by_hand():
    behavior = t(log(0.25), log(0.4), log(0.5))
    logp = t(log(0.5), log(0.2), log(0.5))  # pi/mu = 2.0, 0.5, 1.0
    adv = t(2.0, 2.0, -1.0)
    loss, grad, clipped = grad_of(lambda lp: tis_loss(lp, behavior, adv, 1.5), logp)
    # w = min(pi/mu, 1.5) = 1.5, 0.5, 1.0 ; value -w A ; gradient -w A
    assert torch.allclose(loss, t(-3.0, -1.0, 1.0))
    assert torch.allclose(grad, t(-3.0, -1.0, 1.0))
    assert not clipped.any()


# ----------------------------------------------------------------- decoupled
def test_decoupled_by_hand():
    behavior = t(log(0.25), log(0.25), log(0.5), log(0.1))
    prox = t(log(0.5), log(0.5), log(0.5), log(0.5))  # prox/mu = 2, 2, 1, 5
    logp = t(log(0.75), log(0.55), log(0.3), log(0.5))  # pi/prox = 1.5, 1.1, 0.6, 1.0
    adv = t(1.0, 1.0, -1.0, 1.0)
    loss, grad, clipped = grad_of(
        lambda lp: decoupled_loss(lp, prox, behavior, adv, 0.2, 0.2, 3.0), logp
    )
    # w = min(prox/mu, 3) = 2, 2, 1, 3
    # token 0: r 1.5 > 1.2 with A > 0: clipped, loss -2 * 1.2, no gradient
    # token 1: r 1.1: loss -2 * 1.1, gradient -2 * 1.1
    # token 2: r 0.6 < 0.8 with A < 0: clipped, loss -1 * min(-0.6, -0.8) = 0.8
    # token 3: r 1.0, w truncated to 3: loss -3, gradient -3
    assert torch.allclose(loss, t(-2.4, -2.2, 0.8, -3.0), atol=1e-6)
    assert torch.allclose(grad, t(0.0, -2.2, 0.0, -3.0), atol=1e-6)
    assert clipped.tolist() == [True, False, True, False]


def test_decoupled_with_current_as_proximal_matches_tis():
    """With one optimizer step per batch the proximal log-probs equal the current
    ones: decoupled and tis then give the same loss and gradient."""
    torch.manual_seed(0)
    logp = torch.randn(20).clamp(max=0) - 0.1
    behavior = logp + 0.3 * torch.randn(20)
    adv = torch.randn(20)
    a_loss, a_grad, _ = grad_of(
        lambda lp: decoupled_loss(lp, lp.detach(), behavior, adv, 0.2, 0.2, 2.0), logp
    )
    b_loss, b_grad, _ = grad_of(lambda lp: tis_loss(lp, behavior, adv, 2.0), logp)
    assert torch.allclose(a_loss, b_loss) and torch.allclose(a_grad, b_grad)


def test_on_policy_all_corrections_agree():
    """When behavior == current, every correction is the plain policy gradient -A."""
    logp = t(log(0.3), log(0.6), log(0.9))
    adv = t(1.0, -0.5, 2.0)
    expected = -adv
    for fn in (
        lambda lp: none_loss(lp, logp, adv, 0.2, 0.2),
        lambda lp: tis_loss(lp, logp, adv, 2.0),
        lambda lp: decoupled_loss(lp, lp.detach(), logp, adv, 0.2, 0.2, 2.0),
    ):
        loss, grad, clipped = grad_of(fn, logp)
        assert torch.allclose(loss, expected) and torch.allclose(grad, expected)
        assert not clipped.any()


# ------------------------------------------------------------------ KL, ESS
def test_k3_kl_by_hand():
    kl = k3_kl(t(log(0.5), log(0.3)), t(log(0.25), log(0.3)))
    # d = log 0.5: exp(d) - d - 1 = 0.5 + 0.693147 - 1
    assert torch.allclose(kl, t(0.5 + math.log(2) - 1, 0.0))
    assert (k3_kl(torch.randn(100), torch.randn(100)) >= 0).all()


def test_normalized_ess():
    assert normalized_ess(t(1, 1, 1, 1)) == pytest.approx(1.0)
    assert normalized_ess(t(4, 0, 0, 0)) == pytest.approx(0.25)
    assert normalized_ess(t(2, 1, 1)) == pytest.approx(16 / (3 * 6))
    assert normalized_ess(t()) == 1.0
