"""One micro-batch of a GRPO training step: the forward pass, the per-token
loss, the backward pass, and the micro-batch's :data:`~asyncrl.trainers.packing.STATS`
row.

Kept apart from :mod:`asyncrl.trainers.grpo`, which decides what a step trains
and when the optimizer steps; this module is the loss of one forward/backward.
The loss is the configured correction's per-token loss
(:func:`~asyncrl.trainers.losses.token_losses`), plus ``kl_coef * k3`` against
the KL reference, minus ``entropy_coef`` times the entropy, times the token's
loss weight. Backward runs on the *sum* of the token losses: gradients
accumulate across micro-batches and chunks until the step divides them by its
normaliser.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from asyncrl.config import LossConfig
from asyncrl.trainers import lora as lora_
from asyncrl.trainers.losses import Sequences, kl_penalty, token_losses
from asyncrl.trainers.packing import Packed
from asyncrl.trainers.precision import MasterWeights
from asyncrl.trainers.token_logprobs import TokenScorer


def train_micro_batch(
    batch: Packed, *, model: torch.nn.Module, scorer: TokenScorer, cfg: LossConfig,
    precision: MasterWeights, ref_model: torch.nn.Module | None, lora: Any,
    weight_grad: Callable[[], torch.Tensor] | None, device: torch.device,
) -> torch.Tensor:
    """Forward and backward of one micro-batch; its :data:`STATS` on the device.

    ``ref_model``: the frozen KL reference (None with ``lora``: the model with
    its adapters off is the reference); ``weight_grad``: where the loss head
    adds the output layer's weight gradient (:class:`~asyncrl.trainers.grpo.GRPOTrainer`'s
    ``output_grad_sink``)."""
    logp, entropy = scorer(model, batch, weight_grad=weight_grad)
    mask = batch.mask
    seqs = Sequences(batch.row, batch.rows, (mask > 0).to(logp.dtype))
    loss, clipped, weights, dropped = token_losses(
        cfg, logp, batch.behavior, batch.adv, prox=batch.prox, seqs=seqs)
    kl_sum = torch.zeros((), device=device)
    if cfg.kl_coef > 0:
        with torch.no_grad(), kl_reference(model, ref_model, lora) as ref:
            ref_logp, _ = scorer(ref, batch)
        kl = kl_penalty(cfg, logp, ref_logp, batch.behavior)
        loss = loss + cfg.kl_coef * kl
        kl_sum = (kl.detach() * mask).sum()
    if cfg.entropy_coef > 0:
        loss = loss - cfg.entropy_coef * entropy
    loss = loss * mask
    precision.backward(loss.sum())

    with torch.no_grad():
        mismatch = (logp.detach() - batch.behavior).abs() * mask
        cap = cfg.is_cap
        truncated = weights > cap if cap is not None else torch.zeros_like(clipped)
        if cfg.off_policy_correction == "none" or cfg.mismatch is not None:
            truncated = torch.zeros_like(truncated)  # no is_cap in effect
        zero = torch.zeros((), device=device)
        # How far this step's optimizer steps moved the policy (0 without a proximal pass).
        drift = ((logp.detach() - batch.prox).abs() * mask if batch.prox is not None
                 else torch.zeros_like(mismatch))
        values = (loss.detach().sum(), mismatch.sum(),
                  mismatch.max() if mismatch.numel() else zero, (clipped * mask).sum(),
                  (truncated * mask).sum(), (entropy.detach() * mask).sum(), kl_sum,
                  (weights * mask).sum(), (weights * weights * mask).sum(), drift.sum(),
                  (dropped * mask).sum())
        # float64 holds every float32 sum and integer count exactly.
        return torch.stack([v.to(torch.float64) for v in values])


@contextlib.contextmanager
def kl_reference(model: torch.nn.Module, ref_model: torch.nn.Module | None,
                 lora: Any) -> Iterator[torch.nn.Module | None]:
    """The KL reference model: the frozen copy, or ``model`` with its adapters off."""
    if lora is None:
        yield ref_model
        return
    with lora_.adapters_disabled(lora):
        yield model


__all__ = ["kl_reference", "train_micro_batch"]
