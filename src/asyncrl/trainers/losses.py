"""The GRPO math as pure functions on tensors: per-token losses (token or
sequence ratios, PPO clip with clip-higher and dual clip), KL estimators. The
advantages are in :mod:`asyncrl.trainers.advantages`.

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

# Re-exported: the advantages live with the rewards they start from.
from asyncrl.trainers.advantages import group_advantages as group_advantages

if TYPE_CHECKING:
    from asyncrl.config import LossConfig


def clipped_surrogate(
    ratio: Tensor, adv: Tensor, clip_low: float, clip_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO's clipped surrogate of ``ratio`` (carrying the gradient):
    ``-min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)``, and with
    ``dual_clip`` c the loss of a negative-advantage token capped at ``c |A|``.

    The clip binds (gradient zero) when ``A > 0`` and ``rho > 1 + clip_high``, or
    ``A < 0`` and ``rho < 1 - clip_low``: the policy already moved far enough in
    the advantage's direction. The dual clip binds when ``A < 0`` and
    ``rho > c``: a token the policy now favours far more than the one it was
    sampled from would otherwise push with an unbounded weight.
    """
    surrogate = ratio * adv
    clipped_surrogate = ratio.clamp(1 - clip_low, 1 + clip_high) * adv
    loss = -torch.minimum(surrogate, clipped_surrogate)
    r = ratio.detach()
    clipped = ((adv > 0) & (r > 1 + clip_high)) | ((adv < 0) & (r < 1 - clip_low))
    if dual_clip is not None:
        cap = -dual_clip * adv
        dual = (adv < 0) & (loss.detach() > cap)
        loss = torch.where(dual, cap, loss)
        clipped = clipped | dual
    return loss, clipped


def ppo_clip_loss(
    logp: Tensor, old_logp: Tensor, adv: Tensor, clip_low: float, clip_high: float,
    dual_clip: float | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`clipped_surrogate` of the token ratio ``rho = exp(logp - old_logp)``."""
    return clipped_surrogate(torch.exp(logp - old_logp), adv, clip_low, clip_high, dual_clip)


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


class Sequences:
    """Which sequence each token of a micro-batch belongs to (``index``, one of
    ``count``) and which tokens the loss trains (``trained``, 0/1): what a
    sequence-level ratio averages over."""

    def __init__(self, index: Tensor, count: int, trained: Tensor) -> None:
        self.index, self.count, self.trained = index, count, trained

    def mean(self, values: Tensor) -> Tensor:
        """Per token, the mean of ``values`` over its sequence's trained tokens
        (0 for a sequence with none), differentiable."""
        zeros = values.new_zeros(self.count)
        sums = zeros.index_add(0, self.index, values * self.trained)
        counts = zeros.index_add(0, self.index, self.trained)
        return (sums / counts.clamp(min=1))[self.index]


def log_ratio(new: Tensor, old: Tensor, level: str, seqs: Sequences | None) -> Tensor:
    """``log(new / old)`` per token, or (``level: sequence``) its mean over the
    token's sequence: the log of the geometric mean of the token ratios (GSPO)."""
    diff = new - old
    if level == "token":
        return diff
    if seqs is None:
        raise ValueError("a sequence-level ratio needs the tokens' sequences")
    return seqs.mean(diff)


def token_losses(
    cfg: LossConfig, logp: Tensor, behavior: Tensor, adv: Tensor, *,
    prox: Tensor | None = None, seqs: Sequences | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token loss of ``cfg.off_policy_correction``, the clipped-token mask, the
    untruncated behaviour weights ``pi_prox / mu`` at ``cfg.ratio_level`` (for
    the ESS and truncation metrics), and the tokens ``cfg.mismatch`` dropped.

    ``prox``: the log-probs of the weights at the start of the step (None: the
    current ones, detached - exact while the step takes one optimizer step, see
    :mod:`asyncrl.trainers.grpo`).
    """
    clip_low = cfg.clip_eps
    clip_high = cfg.clip_eps_high if cfg.clip_eps_high is not None else cfg.clip_eps
    level = cfg.ratio_level
    prox = logp.detach() if prox is None else prox
    weights = torch.exp(log_ratio(prox, behavior, level, seqs))
    truncated = behaviour_weight(cfg, weights, prox, behavior, seqs)
    correction = cfg.off_policy_correction
    if correction == "none":
        ratio = torch.exp(log_ratio(logp, behavior, level, seqs))
        loss, clipped = clipped_surrogate(ratio, adv, clip_low, clip_high, cfg.dual_clip)
    elif correction == "tis":
        # Value w * -A, gradient -w A grad(log pi): the ratio to the current
        # (detached) policy is 1 and never clipped.
        ratio = torch.exp(log_ratio(logp, logp.detach(), level, seqs))
        loss, clipped = -truncated * adv * ratio, torch.zeros_like(adv, dtype=torch.bool)
    else:
        ratio = torch.exp(log_ratio(logp, prox, level, seqs))
        loss, clipped = clipped_surrogate(ratio, adv, clip_low, clip_high, cfg.dual_clip)
        loss = truncated * loss
    dropped = torch.zeros_like(clipped)
    mismatch = cfg.mismatch
    if mismatch is not None and mismatch.mode == "drop":
        rho = torch.exp(log_ratio(prox, behavior, mismatch.level, seqs))
        dropped = (rho < mismatch.low) | (rho > mismatch.upper)
        loss = torch.where(dropped, torch.zeros_like(loss), loss)
    return loss, clipped, weights, dropped


def behaviour_weight(cfg: LossConfig, weights: Tensor, prox: Tensor, behavior: Tensor,
                     seqs: Sequences | None) -> Tensor:
    """The weight ``tis`` / ``decoupled`` multiply by: ``min(weights, is_cap)``, or
    with ``mismatch.mode: truncate`` ``pi_prox / mu`` at the mismatch's level
    clamped to its bounds."""
    mismatch = cfg.mismatch
    if mismatch is not None and mismatch.mode == "truncate":
        rho = torch.exp(log_ratio(prox, behavior, mismatch.level, seqs))
        return rho.clamp(mismatch.low, mismatch.upper)
    return weights.clamp(max=cfg.is_cap) if cfg.is_cap is not None else weights


def kl_penalty(cfg: LossConfig, logp: Tensor, ref_logp: Tensor, behavior: Tensor) -> Tensor:
    """Per-token KL(pi_theta || pi_ref) estimate of ``cfg.kl_estimator``, with
    ``d = ref_logp - logp``: k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d; ``d``
    clamped to ``kl_input_clamp`` first, the result to ``kl_output_clamp`` last.
    ``on_policy_kl_approximation`` weights it by ``sg(pi_theta / mu)``: the tokens
    were sampled from mu, and the weighted mean estimates the KL under pi_theta."""
    d = ref_logp - logp
    if cfg.kl_input_clamp is not None:
        d = d.clamp(-cfg.kl_input_clamp, cfg.kl_input_clamp)
    if cfg.kl_estimator == "k1":
        kl = -d
    elif cfg.kl_estimator == "k2":
        kl = d * d / 2
    else:
        kl = torch.exp(d) - 1 - d
    if cfg.on_policy_kl_approximation:
        kl = torch.exp(logp.detach() - behavior) * kl
    if cfg.kl_output_clamp is not None:
        kl = kl.clamp(-cfg.kl_output_clamp, cfg.kl_output_clamp)
    return kl


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
