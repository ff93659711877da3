"""The GRPO math as pure functions on tensors: advantages, per-token losses, KL.

Notation (all per token, log-probs of the token actually generated):

* ``logp``     - log pi_theta, the policy being trained (carries the gradient)
* ``behavior`` - log mu, what the engine sampled with (maybe older weights)
* ``prox``     - log pi_prox, the trainer's weights at the start of the step (no grad)
* ``adv``      - the completion's group-normalised advantage A

Every loss function returns the *unreduced* per-token loss (to be summed over the
step's tokens and divided by their number) and a boolean mask of the tokens whose
gradient the PPO clip zeroed. See docs/training.md for the formulas side by side.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

if TYPE_CHECKING:
    from asyncrl.config import LossConfig


def group_advantages(rewards: Tensor, *, scale: bool = True, eps: float = 1e-6) -> Tensor:
    """GRPO advantages of one group's rewards (along the last dimension).

    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` with the population std (divide by
    n, so a group of one is defined: A = 0), or ``r_i - mean(r)`` when ``scale``
    is False (Dr. GRPO: no division, so groups with tiny reward spread do not get
    huge advantages). A group whose rewards are all equal gets A = 0: it carries
    no learning signal.
    """
    rewards = rewards.float()
    centered = rewards - rewards.mean(dim=-1, keepdim=True)
    if not scale:
        return centered
    return centered / (rewards.std(dim=-1, keepdim=True, correction=0) + eps)


def ppo_clip_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate against ``old_logp``:
    ``-min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)``, ``rho = exp(logp - old_logp)``.

    The clip binds (gradient zero) when ``A > 0`` and ``rho > 1 + clip_high``, or
    ``A < 0`` and ``rho < 1 - clip_low``: the policy already moved far enough in
    the advantage's direction.
    """
    ratio = torch.exp(logp - old_logp)
    surrogate = ratio * adv
    clipped_surrogate = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    loss = -torch.minimum(surrogate, clipped_surrogate)
    r = ratio.detach()
    clipped = ((adv > 0) & (r > 1 + clip_high)) | ((adv < 0) & (r < 1 - clip_low))
    return loss, clipped


def none_loss(
    logp: Tensor, behavior: Tensor, adv: Tensor, clip_low: float, clip_high: float
) -> tuple[Tensor, Tensor]:
    """``off_policy_correction: none`` - plain PPO with the behavior log-probs as
    the "old" policy: ``-min(rho A, clip(rho) A)``, ``rho = pi_theta / mu``.

    Stale samples are corrected only through rho; tokens whose rho already left
    the clip range give no gradient.
    """
    return ppo_clip_loss(logp, behavior, adv, clip_low, clip_high)


def tis_loss(logp: Tensor, behavior: Tensor, adv: Tensor, is_cap: float) -> tuple[Tensor, Tensor]:
    """``off_policy_correction: tis`` - truncated importance sampling, no clip:
    ``-w * A * exp(logp - sg(logp))`` with ``w = min(exp(sg(logp) - behavior), is_cap)``
    (``sg``: stop-gradient).

    The value is ``-w A`` and the gradient ``-w A grad(log pi_theta)``: the
    policy gradient reweighted by the truncated ratio pi_theta/mu. Equivalently,
    the PPO-style loss whose clip is taken against the current (detached) policy,
    where it never binds. Truncation at ``is_cap`` bounds the variance that rare
    tokens (mu small) would otherwise add. No token is clipped.
    """
    current = logp.detach()
    w = torch.exp(current - behavior).clamp(max=is_cap)
    loss = -w * adv * torch.exp(logp - current)
    return loss, torch.zeros_like(loss, dtype=torch.bool)


def decoupled_loss(
    logp: Tensor,
    prox: Tensor,
    behavior: Tensor,
    adv: Tensor,
    clip_low: float,
    clip_high: float,
    is_cap: float,
) -> tuple[Tensor, Tensor]:
    """``off_policy_correction: decoupled`` - decoupled PPO (behavior and proximal
    policies kept apart): ``w * -min(r A, clip(r) A)`` with ``r = pi_theta / pi_prox``
    and ``w = min(pi_prox / mu, is_cap)``.

    The trust region is taken around the proximal policy (the trainer's weights
    at the start of the step), not around the stale behavior policy, and the
    staleness itself is corrected by the truncated weight ``w``.
    """
    w = torch.exp(prox - behavior).clamp(max=is_cap)
    loss, clipped = ppo_clip_loss(logp, prox, adv, clip_low, clip_high)
    return w * loss, clipped


def token_losses(
    cfg: LossConfig, logp: torch.Tensor, behavior: torch.Tensor, adv: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-token loss of ``cfg.off_policy_correction``, the clipped-token mask, and
    the untruncated importance weights the correction sees (for the ESS metric)."""
    clip_low = cfg.clip_eps
    clip_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    # Proximal = the trainer's weights at the start of the step = the current
    # ones, detached: the optimizer steps only when the step ends (asyncrl.trainers.grpo).
    prox = logp.detach()
    weights = torch.exp(prox - behavior)
    if cfg.off_policy_correction == "none":
        loss, clipped = none_loss(logp, behavior, adv, clip_low, clip_high)
    elif cfg.off_policy_correction == "tis":
        loss, clipped = tis_loss(logp, behavior, adv, cfg.is_cap)
    else:
        loss, clipped = decoupled_loss(logp, prox, behavior, adv, clip_low, clip_high, cfg.is_cap)
    return loss, clipped, weights


def k3_kl(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate "k3": ``exp(d) - d - 1``,
    ``d = ref_logp - logp``. Never negative, unbiased for tokens sampled from
    pi_theta, and low-variance (Schulman, "Approximating KL divergence")."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1


def normalized_ess(weights: Tensor) -> float:
    """Effective sample size of importance weights divided by their number:
    ``(sum w)^2 / (n * sum w^2)`` in (0, 1]; 1 when all weights are equal
    (on-policy), near 0 when a few samples dominate."""
    if weights.numel() == 0:
        return 1.0
    w = weights.double()
    return float(w.sum() ** 2 / (w.numel() * (w * w).sum()))
