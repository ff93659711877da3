"""Several optimizer steps per training step: mini-batches, epochs, and the
proximal log-probs that make their clips act.

With ``policy.train_mini_batches`` = M and ``policy.train_epochs`` = E, a
training step's completions (its groups in prompt order) are cut into M
mini-batches of about equal completion tokens, and the step takes M x E
optimizer steps: one per mini-batch, in order, for each epoch. Each optimizer
step's loss is normalised over its own mini-batch (``loss.aggregation`` over
the mini-batch, NeMo-RL's and verl's choice); the micro-batches of
``train_micro_batch_tokens`` inside a mini-batch only bound memory.

Before the first optimizer step, the proximal log-probs pi_prox of every
completion token are computed once with the weights at the start of the step
(a forward pass without gradient, micro-batched like the loss). From the
second optimizer step on, ``r = pi_theta / pi_prox`` departs from 1, so the PPO
clip, the dual clip and ``decoupled``'s trust region act; ``train/prox_drift``
is the mean ``|log pi_theta - log pi_prox|`` the loss saw.

The weight version still advances once per training step: version v + 1 is
the weights after the step's last optimizer step, the only ones the engines
receive and the samplers count staleness in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from asyncrl.trainers.packing import Flat, Packed, pack, plan_micro_batches


def split(flat: Flat, count: int) -> list[list[int]]:
    """``count`` runs of consecutive completions of ``flat`` (fewer when it has
    fewer completions), each about ``1 / count`` of its completion tokens: a
    run ends at the first completion whose cumulative tokens reach its share."""
    sizes = [len(b) for b in flat.behavior]
    total = sum(sizes)
    count = max(1, min(count, len(sizes)))
    batches: list[list[int]] = [[] for _ in range(count)]
    done = 0
    for i, size in enumerate(sizes):
        # The mini-batch whose share the tokens before this completion fill.
        batches[min(done * count // max(total, 1), count - 1)].append(i)
        done += size
    batches = [b for b in batches if b]
    return _fill(batches, count, len(sizes))


def _fill(batches: list[list[int]], count: int, n: int) -> list[list[int]]:
    """Split the longest runs until there are ``count`` (a run of one completion
    cannot be split; ``n`` completions make at most ``n`` runs)."""
    while len(batches) < min(count, n):
        longest = max(range(len(batches)), key=lambda j: (len(batches[j]), -j))
        run = batches[longest]
        half = len(run) // 2
        batches[longest:longest + 1] = [run[:half], run[half:]]
    return batches


def proximal(flat: Flat, score: Callable[[Packed], torch.Tensor], *, budget: int,
             pad_id: int, device: torch.device) -> list[list[float]]:
    """Per completion of ``flat``, per token, its log-prob under ``score`` (the
    model with the step's start weights), without gradient."""
    out: list[list[float]] = [[] for _ in flat.seqs]
    with torch.no_grad():
        for rows in plan_micro_batches([len(s) for s in flat.seqs], budget):
            batch = pack(flat, rows, pad_id=pad_id, device=device)
            logp = score(batch).float().cpu().tolist()
            at = 0
            for r in rows:
                n = len(flat.behavior[r])
                out[r] = logp[at:at + n]
                at += n
    return out


def epoch_batches(flat: Flat, mini_batches: int, epochs: int) -> Sequence[list[int]]:
    """The mini-batches of every epoch, in the order they are trained."""
    runs = split(flat, mini_batches)
    return [rows for _ in range(epochs) for rows in runs]


#: Counts over the training step: summed over its optimizer steps.
_SUMMED = ("micro_batches", "skipped_nonfinite_step")


def merged_step_metrics(steps: list[dict[str, float]], epochs: int = 1,
                        real: int = 0, padded: int = 0) -> dict[str, float]:
    """One training step's metrics from its optimizer steps' own (docs/training.md):

    * ``loss`` and ``grad_norm``: their mean over the optimizer steps;
    * ``micro_batches`` (forward/backward passes) and ``skipped_nonfinite_step``
      (optimizer steps skipped for a non-finite gradient): their sums;
    * ``step_tokens``: the loss divisors of one epoch's mini-batches summed - the
      step's own divisor, as with one optimizer step (every epoch repeats them);
      ``optimizer_step_tokens``: their mean, the divisor of one optimizer step;
    * ``pad_frac`` over every micro-batch of the step (``real`` tokens of
      ``padded`` positions);
    * anything else (``loss_scale``): the last optimizer step's, the state the
      next step starts from.
    """
    merged = {k: v for k, v in steps[-1].items() if k != "loss"} if steps else {}
    losses = [s["loss"] for s in steps if "loss" in s]
    if losses:
        merged["loss"] = sum(losses) / len(losses)
    if steps:
        merged["grad_norm"] = sum(s.get("grad_norm", 0.0) for s in steps) / len(steps)
        for key in _SUMMED:
            total = sum(s.get(key, 0.0) for s in steps)
            merged.pop(key, None)
            if total:
                merged[key] = total
        divisors = [s.get("step_tokens", 0.0) for s in steps]
        per_epoch = max(1, len(steps) // max(epochs, 1))
        merged["step_tokens"] = float(sum(divisors[:per_epoch]))
        merged["optimizer_step_tokens"] = sum(divisors) / len(divisors)
    merged.pop("pad_frac", None)
    if padded:
        merged["pad_frac"] = 1.0 - real / padded
    merged["optimizer_steps"] = float(len(steps))
    return merged


__all__ = ["epoch_batches", "merged_step_metrics", "proximal", "split"]
