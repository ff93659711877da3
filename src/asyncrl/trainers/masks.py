"""Which tokens a training step learns from, and with which rewards.

One function decides, per completion and per token, whether a token is
*trained and counted* (1: it gets a gradient and counts in the step's token
mean) or *excluded* (0). A token is excluded when

* the record says the policy did not choose it (``Completion.loss_mask`` 0,
  e.g. a tool's output in a multi-turn rollout);
* it is older than ``loss.max_token_staleness``: sampled with weights more than
  that many versions before the step that trains it (``step - version``);
* its completion was cut at ``max_new_tokens`` (``finish_reason == "length"``)
  and ``loss.truncated`` is ``mask``.

Excluded tokens still count where the group's rewards do: every completion's
reward stays in its group's advantage baseline. ``loss.truncated:
zero_reward`` instead trains a truncated completion with reward 0
(:func:`training_rewards`).

The trainer multiplies its per-token loss by these masks; the functions are
pure so that any trainer (or the simulator) applies exactly the same rule. The
module imports no torch: ``asyncrl simulate`` and the autopilot's planner
process import it, and torch would add ~1.5 s to each of their starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncrl.config import LossConfig
from asyncrl.types import Completion, Rollout


@dataclass
class MaskStats:
    """Counts over the rollouts a mask was computed for."""

    tokens: int = 0
    masked: int = 0
    completions: int = 0
    truncated: int = 0

    def metrics(self) -> dict[str, float]:
        return {"masked_token_frac": self.masked / self.tokens if self.tokens else 0.0,
                "truncated_frac": self.truncated / self.completions if self.completions else 0.0}


def token_masks(rollout: Rollout, *, step: int, cfg: LossConfig,
                stats: MaskStats | None = None) -> list[list[float]]:
    """Per completion of ``rollout``, per token: 1.0 (trained and counted) or 0.0
    (excluded), for training step ``step`` (the trainer version that trains it)."""
    out = []
    bound = cfg.max_token_staleness
    for c in rollout.result.completions:
        truncated = c.finish_reason == "length"
        if truncated and cfg.truncated == "mask":
            mask = [0.0] * len(c)
        else:
            mask = [float(m) for m in c.mask_list()]
            if bound is not None:
                oldest = step - bound  # tokens of older versions are excluded
                at = 0
                for version, count in c.versions:
                    if version < oldest:
                        mask[at : at + count] = [0.0] * count
                    at += count
        if stats is not None:
            stats.tokens += len(mask)
            stats.masked += len(mask) - int(sum(mask))
            stats.completions += 1
            stats.truncated += truncated
        out.append(mask)
    return out


def training_rewards(rollout: Rollout, cfg: LossConfig,
                     max_new_tokens: int | None = None) -> list[float]:
    """The rewards the advantages are computed from: the group's own, except that
    ``loss.truncated: zero_reward`` gives a truncated completion 0,
    ``loss.reward_scaling`` rescales the others and ``loss.overlong`` adds DAPO's
    length penalty (up to ``max_new_tokens`` when its ``max_tokens`` is unset)."""
    out = []
    for c, r in zip(rollout.result.completions, rollout.rewards):
        if cfg.truncated == "zero_reward" and c.finish_reason == "length":
            out.append(0.0)
        else:
            out.append(shaped(float(r), c, cfg, max_new_tokens))
    return out


def overlong_penalty(length: int, *, limit: int, buffer: int, penalty: float) -> float:
    """DAPO's soft overlong punishment of a completion of ``length`` tokens: 0 up to
    ``limit - buffer``, then falling linearly, ``-penalty`` at ``limit`` (and
    lower beyond it, as NeMo-RL and verl compute it)."""
    return min(0.0, -(length - (limit - buffer)) / buffer * penalty)


def shaped(reward: float, completion: Completion, cfg: LossConfig,
           max_new_tokens: int | None) -> float:
    """``reward``, rescaled by ``loss.reward_scaling``, plus ``loss.overlong``'s
    penalty for ``completion``'s length (NeMo-RL's order: scale, then shape)."""
    if cfg.reward_scaling is not None:
        reward = cfg.reward_scaling.apply(reward)
    over = cfg.overlong
    if over is None:
        return reward
    if over.max_tokens is None and max_new_tokens is None:
        raise ValueError("loss.overlong needs its max_tokens, or the trainer's max_new_tokens")
    limit = over.limit(max_new_tokens or 0)
    return reward + overlong_penalty(len(completion), limit=limit, buffer=over.buffer_tokens,
                                     penalty=over.penalty)
