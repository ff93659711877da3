"""From rollouts to the tensors of a trainer forward pass, and back to metrics.

Kept apart from :mod:`asyncrl.trainers.grpo` and
:mod:`asyncrl.trainers.micro_batch` so that they read as the step and the loss;
everything here is host-side bookkeeping plus one copy to the device per
tensor, made without waiting (no host synchronisation inside a micro-batch).

Every completion token carries a **loss weight** (:attr:`Flat.loss_mask`): it
multiplies the token's loss (policy gradient, KL and entropy terms alike) and
its metrics, and the step's loss is normalised by the *sum* of the weights - so
a token of weight 0 neither contributes gradient nor dilutes the mean. Which
tokens weigh 0 (a token the policy did not choose, one older than
``loss.max_token_staleness``, a truncated completion under ``loss.truncated:
mask``) is decided in one place, :func:`asyncrl.trainers.masks.token_masks`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from asyncrl.config import LossConfig
from asyncrl.trainers.advantages import step_advantages
from asyncrl.trainers.masks import MaskStats, token_masks, training_rewards
from asyncrl.types import Rollout

#: Per-micro-batch sums (one float64 device tensor, moved to the host once per chunk).
#: Every sum but ``mismatch_max`` is weighted by the tokens' loss weights.
STATS = ("loss", "mismatch", "mismatch_max", "clipped", "truncated", "entropy", "kl", "w", "w2",
         "drift", "dropped")


@dataclass
class Flat:
    """The completions of a chunk, one entry per non-empty completion."""

    seqs: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    behavior: list[list[float]] = field(default_factory=list)
    #: Per completion token: its loss weight (see the module docstring).
    loss_mask: list[list[float]] = field(default_factory=list)
    advs: list[float] = field(default_factory=list)
    group_adv: list[torch.Tensor] = field(default_factory=list)
    mask_stats: MaskStats = field(default_factory=MaskStats)
    #: Per completion token: the proximal log-prob (the weights at the start of
    #: the step), when computed by a pass of its own (None: the loss's own forward).
    prox: list[list[float]] | None = None
    #: Per completion: its share of the step's loss normaliser (:func:`aggregated`).
    norms: list[float] = field(default_factory=list)

    @property
    def weight(self) -> float:
        """The sum of the chunk's loss weights (the token means of its metrics)."""
        return float(sum(sum(m) for m in self.loss_mask))

    def subset(self, rows: Sequence[int]) -> Flat:
        """The completions ``rows`` of this chunk (a mini-batch), with their share
        of the normaliser; the group statistics stay with the whole chunk."""
        part = Flat(seqs=[self.seqs[r] for r in rows], starts=[self.starts[r] for r in rows],
                    behavior=[self.behavior[r] for r in rows],
                    loss_mask=[self.loss_mask[r] for r in rows],
                    advs=[self.advs[r] for r in rows],
                    prox=None if self.prox is None else [self.prox[r] for r in rows],
                    norms=[self.norms[r] for r in rows])
        part.mask_stats = self.mask_stats
        return part

    @property
    def norm(self) -> float:
        """The chunk's share of the step's loss normaliser (``loss.aggregation``)."""
        return float(sum(self.norms))

    @property
    def completion_tokens(self) -> int:
        return sum(len(b) for b in self.behavior)


def flatten(rollouts: Sequence[Rollout], *, loss: LossConfig, step: int,
            max_new_tokens: int | None = None) -> Flat:
    """Prompt + completion token ids, where completions start, behavior log-probs,
    loss weights and advantages of every completion of ``rollouts``, for training
    step ``step`` (the trainer version that trains them). ``max_new_tokens``: the
    generation limit (``loss.aggregation: constant`` and ``loss.overlong``)."""
    flat = Flat()
    rewards = [torch.tensor(training_rewards(r, loss, max_new_tokens), dtype=torch.float32)
               for r in rollouts]
    flat.group_adv = step_advantages(rewards, loss)
    for rollout, adv in zip(rollouts, flat.group_adv):
        res = rollout.result
        masks = token_masks(rollout, step=step, cfg=loss, stats=flat.mask_stats)
        advs = adv.tolist()  # one read of the tensor, not one per completion
        for i, completion in enumerate(res.completions):
            if not completion.token_ids:
                continue
            weights, norm = aggregated(masks[i], loss, max_new_tokens)
            flat.seqs.append(list(res.prompt_ids) + list(completion.token_ids))
            flat.starts.append(len(res.prompt_ids))
            flat.behavior.append(list(completion.logprobs))
            flat.loss_mask.append(weights)
            flat.advs.append(advs[i])
            flat.norms.append(norm)
    return flat


def aggregated(mask: list[float], loss: LossConfig,
               max_new_tokens: int | None) -> tuple[list[float], float]:
    """One completion's token loss weights under ``loss.aggregation``, and its
    share of the step's normaliser (the step's loss is the weighted token-loss
    sum over the normaliser, whatever the chunks, micro-batches and ranks):

    * ``token_mean``: weights = mask, share = the trained tokens;
    * ``sequence_mean``: weights = mask / trained tokens, share = 1 (a completion
      with no trained token: 0) - the mean over sequences of token means;
    * ``constant``: weights = mask, share = ``max_new_tokens`` (for a completion
      with a trained token) - Dr. GRPO's sum over ``sequences x max_new_tokens``.
    """
    trained = float(sum(mask))
    if loss.aggregation == "token_mean" or trained == 0:
        return mask, trained
    if loss.aggregation == "sequence_mean":
        return [m / trained for m in mask], 1.0
    if max_new_tokens is None:
        raise ValueError("loss.aggregation: constant needs the trainer's max_new_tokens")
    return mask, float(max_new_tokens)


def plan_micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Which sequences (by index into ``lengths``) go through one forward/backward together.

    Sequences are taken longest first, and a micro-batch takes the next one while
    its rows times its longest row stay within ``budget`` tokens; a sequence
    longer than the budget gets a micro-batch of its own. Sorting by length keeps
    the padding to the length differences of neighbours. A pure function of the
    lengths, so the number of passes a chunk takes is known before any is run.
    """
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    width = 0
    for i in order:
        if batches and (len(batches[-1]) + 1) * width <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
            width = lengths[i]  # the first row of a batch is its longest
    return batches


@dataclass
class Packed:
    """One micro-batch on the device.

    ``ids`` is right-padded, so every row's positions are the default ``0..L-1``
    and, the model being causal, a real token never attends to a pad: no
    attention mask is needed (which lets SDPA use its causal kernels and spares
    transformers a host-side check of the mask). ``positions`` lists, row by row,
    the flat indices into ``[rows * L]`` of the positions whose output predicts a
    completion token (position ``j`` predicts token ``j + 1``), ``targets`` those
    tokens; ``behavior``, ``adv`` and ``mask`` are per completion token, in the
    same order.
    """

    ids: torch.Tensor
    positions: torch.Tensor
    targets: torch.Tensor
    behavior: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor
    #: Per completion token: its row (the sequence it belongs to).
    row: torch.Tensor
    #: Per completion token: the proximal log-prob (None: see :attr:`Flat.prox`).
    prox: torch.Tensor | None = None
    #: Rows (sequences) in the micro-batch.
    rows: int = 0
    #: Host-side counts: the loss weight of the micro-batch, its real tokens and
    #: its padded positions (rows x longest row).
    weight: float = 0.0
    real: int = 0
    padded: int = 0

    @property
    def tokens(self) -> int:
        return self.positions.numel()


def pack(flat: Flat, rows: Sequence[int], *, pad_id: int, device: torch.device) -> Packed:
    """The micro-batch of ``flat``'s sequences ``rows``."""
    seqs = [flat.seqs[r] for r in rows]
    width = max(len(s) for s in seqs)
    # One tensor from the right-padded rows (not a torch call per row).
    ids = torch.tensor([seq + [pad_id] * (width - len(seq)) for seq in seqs], dtype=torch.long)
    positions: list[int] = []
    targets: list[int] = []
    for row, (r, seq) in enumerate(zip(rows, seqs)):
        start, base = flat.starts[r], row * width
        positions.extend(range(base + start - 1, base + len(seq) - 1))
        targets.extend(seq[start:])
    behavior = [x for r in rows for x in flat.behavior[r]]
    mask = [x for r in rows for x in flat.loss_mask[r]]
    adv = [flat.advs[r] for r in rows for _ in flat.behavior[r]]
    row_of = [row for row, r in enumerate(rows) for _ in flat.behavior[r]]
    host = (ids, torch.tensor(positions, dtype=torch.long), torch.tensor(targets),
            torch.tensor(behavior), torch.tensor(adv), torch.tensor(mask),
            torch.tensor(row_of, dtype=torch.long))
    prox = None
    if flat.prox is not None:
        prox = torch.tensor([x for r in rows for x in flat.prox[r]]).to(device, non_blocking=True)
    # Pageable host memory: the driver stages the copy at once, no device wait.
    return Packed(*(t.to(device, non_blocking=True) for t in host), prox=prox, rows=len(rows),
                  weight=float(sum(mask)), real=sum(len(s) for s in seqs),
                  padded=len(seqs) * width)


def idle_pass(*, pad_id: int, device: torch.device) -> Packed:
    """A micro-batch of one pad token with loss weight 0: a forward and backward
    that change no gradient. A data-parallel trainer runs it on a rank with fewer
    micro-batches than another, so that every rank runs the same number of passes."""
    flat = Flat(seqs=[[pad_id, pad_id]], starts=[1], behavior=[[0.0]], loss_mask=[[0.0]],
                advs=[0.0])
    packed = pack(flat, [0], pad_id=pad_id, device=device)
    packed.real = packed.padded = 0  # not data: leave it out of train/pad_frac
    return packed


def chunk_metrics(
    stats: list[list[float]], flat: Flat, *, repeats: int = 1
) -> tuple[dict[str, float], dict[str, float]]:
    """``train_chunk``'s metrics from the micro-batches' :data:`STATS` rows, and
    the sums over the chunk. Token means are weighted by the loss weights;
    ``repeats``: how many times the rows went over ``flat`` (epochs)."""
    sums = dict.fromkeys(STATS, 0.0)
    mismatch_max = 0.0
    for row in stats:
        for key, value in zip(STATS, row):
            sums[key] += value
        mismatch_max = max(mismatch_max, row[STATS.index("mismatch_max")])
    weight = flat.weight * repeats
    n = weight if weight > 0 else 1.0
    group_adv = flat.group_adv
    all_adv = torch.cat(group_adv) if group_adv else torch.zeros(1)
    tokens = flat.completion_tokens
    metrics = {
        "loss": sums["loss"] / n,
        "logprob_mismatch": sums["mismatch"] / n,
        "logprob_mismatch_max": mismatch_max,
        "clip_frac": sums["clipped"] / n,
        "is_truncated_frac": sums["truncated"] / n,
        "is_ess": sums["w"] ** 2 / (n * sums["w2"]) if sums["w2"] > 0 else 1.0,
        "entropy": sums["entropy"] / n,
        "prox_drift": sums["drift"] / n,
        "mismatch_dropped_frac": sums["dropped"] / n,
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
