"""From rollouts to the tensors of a trainer forward pass, and back to metrics.

Kept apart from :mod:`asyncrl.trainers.grpo` so that the trainer reads as the
loss; everything here is host-side bookkeeping plus one copy to the device per
tensor, made without waiting (no host synchronisation inside a micro-batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from asyncrl.config import LossConfig
from asyncrl.trainers.losses import group_advantages
from asyncrl.trainers.masks import MaskStats, token_masks, training_rewards
from asyncrl.types import Rollout

#: Per-micro-batch sums (one float64 device tensor, moved to the host once per chunk).
#: ``counted``: tokens the loss counts (its mask is 1, :mod:`asyncrl.trainers.masks`).
STATS = ("loss", "mismatch", "mismatch_max", "clipped", "truncated", "entropy", "kl", "w", "w2",
         "counted")


@dataclass
class Flat:
    """The completions of a chunk, one entry per non-empty completion."""

    seqs: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    behavior: list[list[float]] = field(default_factory=list)
    advs: list[float] = field(default_factory=list)
    group_adv: list[torch.Tensor] = field(default_factory=list)
    #: Per completion, per token: 1 trained and counted, 0 excluded.
    masks: list[list[float]] = field(default_factory=list)
    mask_stats: MaskStats = field(default_factory=MaskStats)


def flatten(rollouts: Sequence[Rollout], *, loss: LossConfig, step: int) -> Flat:
    """Prompt + completion token ids, where completions start, behavior log-probs,
    advantages and token masks of every completion of ``rollouts``, for training
    step ``step``."""
    flat = Flat()
    for rollout in rollouts:
        res = rollout.result
        adv = group_advantages(
            torch.tensor(training_rewards(rollout, loss), dtype=torch.float32),
            scale=loss.scale_advantages,
        )
        flat.group_adv.append(adv)
        masks = token_masks(rollout, step=step, cfg=loss, stats=flat.mask_stats)
        for i, completion in enumerate(res.completions):
            if not completion.token_ids:
                continue
            flat.seqs.append(list(res.prompt_ids) + list(completion.token_ids))
            flat.starts.append(len(res.prompt_ids))
            flat.behavior.append(completion.logprobs)
            flat.advs.append(float(adv[i]))
            flat.masks.append(masks[i])
    return flat


@dataclass
class Packed:
    """One micro-batch on the device.

    ``ids`` is right-padded, so every row's positions are the default ``0..L-1``
    and, the model being causal, a real token never attends to a pad: no
    attention mask is needed (which lets SDPA use its causal kernels and spares
    transformers a host-side check of the mask). ``index`` lists the completion
    tokens in the flattened ``[rows, positions - 1]`` grid (logits at position
    ``j`` predict token ``j + 1``), row by row: the order in which the rows'
    behavior log-probs are concatenated in ``behavior``.
    """

    ids: torch.Tensor
    index: torch.Tensor
    behavior: torch.Tensor
    adv: torch.Tensor
    #: 1 for tokens the loss trains and counts, 0 for excluded ones.
    mask: torch.Tensor

    @property
    def tokens(self) -> int:
        return self.index.numel()


def pack(
    seqs: list[list[int]], starts: list[int], behavior: list[list[float]], advs: list[float],
    masks: list[list[float]], *, pad_id: int, device: torch.device,
) -> Packed:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    index: list[int] = []
    for r, (seq, start) in enumerate(zip(seqs, starts)):
        ids[r, : len(seq)] = torch.tensor(seq)
        base = r * (width - 1)
        index.extend(range(base + start - 1, base + len(seq) - 1))
    behavior_t = torch.tensor([x for b in behavior for x in b])
    adv_t = torch.tensor([a for a, b in zip(advs, behavior) for _ in b])
    mask_t = torch.tensor([x for m in masks for x in m], dtype=torch.float32)
    # Pageable host memory: the driver stages the copy at once, no device wait.
    return Packed(
        *(t.to(device, non_blocking=True)
          for t in (ids, torch.tensor(index, dtype=torch.long), behavior_t, adv_t, mask_t))
    )


def chunk_metrics(
    stats: list[list[float]], tokens: int, flat: Flat
) -> tuple[dict[str, float], dict[str, float]]:
    """``train_chunk``'s metrics from the micro-batches' :data:`STATS` rows, and
    the sums over the chunk."""
    sums = dict.fromkeys(STATS, 0.0)
    mismatch_max = 0.0
    for row in stats:
        for key, value in zip(STATS, row):
            sums[key] += value
        mismatch_max = max(mismatch_max, row[STATS.index("mismatch_max")])
    n = max(tokens, 1)
    counted = max(sums["counted"], 1.0)
    group_adv = flat.group_adv
    all_adv = torch.cat(group_adv) if group_adv else torch.zeros(1)
    metrics = {
        "loss": sums["loss"] / counted,
        "logprob_mismatch": sums["mismatch"] / n,
        "logprob_mismatch_max": mismatch_max,
        "clip_frac": sums["clipped"] / n,
        "is_truncated_frac": sums["truncated"] / n,
        "is_ess": sums["w"] ** 2 / (n * sums["w2"]) if sums["w2"] > 0 else 1.0,
        "entropy": sums["entropy"] / n,
        "advantage_mean": float(all_adv.mean()),
        "advantage_std": float(all_adv.std(correction=0)),
        "advantage_abs_mean": float(all_adv.abs().mean()),
        "zero_advantage_group_frac": (
            sum(bool((a == 0).all()) for a in group_adv) / max(len(group_adv), 1)
        ),
        "completion_tokens_mean": tokens / max(len(flat.seqs), 1),
        "num_tokens": float(tokens),
        **flat.mask_stats.metrics(),
    }
    return metrics, sums
