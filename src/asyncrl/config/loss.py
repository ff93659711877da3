"""The ``loss`` block: advantages, the policy-gradient loss and its corrections,
how token losses are aggregated, KL and entropy terms, token masks, reward
shaping for length. docs/training.md, "The loss", has every formula; the pure
functions are :mod:`asyncrl.trainers.losses` and :mod:`asyncrl.trainers.advantages`.

Combinations that mean nothing are refused here with the reason (a dual clip
on ``tis``, which has no clip; a truncated behaviour weight on ``none``, which
has none; an on-policy KL weight without a KL term), so a
run never silently trains something other than what its config says.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, StrictFloat, field_validator, model_validator

from asyncrl.config.blocks import Block, NonNegFloat, NonNegInt, PosFloat, PosInt

#: ``loss.dual_clip``: NeMo-RL's ``ratio_clip_c``, which must be above 1.
DualClip = Annotated[StrictFloat, Field(gt=1)]


class MismatchConfig(Block):
    """``loss.mismatch``: bounds on ``rho = pi_prox / mu``, the ratio between the
    trainer's step-start weights and the engine's behaviour log-probs (staleness
    plus the engine-trainer mismatch, e.g. a bf16 engine).

    * ``level``: per token, or per sequence - the geometric mean of ``rho`` over
      the tokens the loss trains.
    * ``mode: truncate`` - the behaviour weight of ``tis`` / ``decoupled`` is
      ``clamp(rho, lower, upper)`` at that level (verl's ``rollout_is``), in
      place of ``min(rho, is_cap)``.
    * ``mode: drop`` - a token (or every token of a sequence) whose ``rho``
      leaves ``[lower, upper]`` gets no loss (rejection: verl's ``rollout_rs``,
      NeMo-RL's ``icepop`` / ``seq-mask-tis``); the normaliser keeps counting it
      (AReaL's choice: it is known before the forward pass), and the tokens
      kept keep their correction's own weight. ``train/mismatch_dropped_frac``
      says how many tokens went.
    """

    level: Literal["token", "sequence"] = "sequence"
    mode: Literal["truncate", "drop"] = "drop"
    #: truncate: the lower clamp (None: 0, none); drop: the lower bound (None: 1 / upper).
    lower: NonNegFloat | None = None
    upper: PosFloat = 2.0

    @property
    def low(self) -> float:
        """The lower bound in effect."""
        if self.lower is not None:
            return self.lower
        return 0.0 if self.mode == "truncate" else 1.0 / self.upper

    @model_validator(mode="after")
    def _bounds(self) -> MismatchConfig:
        if self.low >= self.upper:
            raise ValueError(f"mismatch.lower={self.low:g} must be below mismatch.upper="
                             f"{self.upper:g}: no ratio would be inside the bounds")
        return self


class OverlongConfig(Block):
    """``loss.overlong``: DAPO's soft overlong punishment, added to a completion's
    reward before its advantage: ``min(0, -(L - (L_max - buffer)) / buffer * penalty)``
    for a completion of ``L`` tokens - 0 up to ``L_max - buffer``, then linear,
    ``-penalty`` at ``L_max`` (beyond it, when ``max_tokens`` is below
    ``max_new_tokens``, lower still: NeMo-RL's and verl's formula, no floor)."""

    buffer_tokens: PosInt
    penalty: NonNegFloat = 1.0
    #: L_max; None: policy.generation.max_new_tokens (NeMo-RL's
    #: ``${policy.max_total_sequence_length}`` reads as that too).
    max_tokens: PosInt | None = None

    def limit(self, max_new_tokens: int) -> int:
        return self.max_tokens if self.max_tokens is not None else max_new_tokens

    def mistake(self, max_new_tokens: int) -> str | None:
        """Why this penalty cannot work with a generation limit of ``max_new_tokens``
        (None: it can). It starts at ``limit - buffer_tokens``; at or below 0 every
        completion is penalised, whatever its length: refused."""
        limit = self.limit(max_new_tokens)
        where = (f"loss.overlong.max_tokens={limit}" if self.max_tokens is not None
                 else f"policy.generation.max_new_tokens={limit} (the penalty's max_tokens "
                 "when it is left out)")
        if self.buffer_tokens >= limit:
            return (f"loss.overlong.buffer_tokens={self.buffer_tokens} is not below {where}: "
                    "every completion would be penalised; set buffer_tokens below it")
        return None

    def inert(self, max_new_tokens: int) -> str | None:
        """A warning when no completion can reach the penalty (it starts at or past
        ``max_new_tokens``): legal - a recipe's block kept while the generation limit
        is shrunk for a quick run - but it does nothing."""
        start = self.limit(max_new_tokens) - self.buffer_tokens
        if start < max_new_tokens:
            return None
        return (f"loss.overlong penalises completions longer than max_tokens - buffer_tokens"
                f" = {self.limit(max_new_tokens)} - {self.buffer_tokens} = {start} tokens, but "
                f"policy.generation.max_new_tokens={max_new_tokens} stops every completion by "
                "then: the penalty never applies (lower loss.overlong.max_tokens, or leave it "
                "out: max_new_tokens)")


class RewardScalingConfig(Block):
    """``loss.reward_scaling``: each task reward clamped to ``[source_min,
    source_max]`` and mapped linearly onto ``[target_min, target_max]`` before its
    advantage and before ``loss.overlong`` (NeMo-RL's ``grpo.reward_scaling``,
    in NeMo-RL's order). The dynamic-sampling filter and ``reward_mean`` see the
    task's own rewards."""

    source_min: StrictFloat = 0.0
    source_max: StrictFloat = 1.0
    target_min: StrictFloat = 0.0
    target_max: StrictFloat = 1.0

    @model_validator(mode="after")
    def _a_range(self) -> RewardScalingConfig:
        if self.source_max <= self.source_min:
            raise ValueError(f"reward_scaling.source_max={self.source_max:g} must be above "
                             f"source_min={self.source_min:g}: the map divides by their span")
        return self

    def apply(self, reward: float) -> float:
        clamped = min(max(reward, self.source_min), self.source_max)
        span = (self.target_max - self.target_min) / (self.source_max - self.source_min)
        return self.target_min + (clamped - self.source_min) * span


class LossConfig(Block):
    clip_eps: PosFloat = 0.2
    #: Upper clip (None: same as clip_eps). Larger values are "clip-higher".
    clip_eps_high: PosFloat | None = None
    #: Dual clip c > 1 (NeMo-RL's ratio_clip_c): a negative-advantage token's loss
    #: is capped at ``c |A|``, whatever its ratio (None: off).
    dual_clip: DualClip | None = None
    #: token: PPO's per-token ratio; sequence: GSPO's, the geometric mean of the
    #: token ratios over the tokens the loss trains, clipped per sequence (with
    #: tis / decoupled the behaviour weight is per sequence too).
    ratio_level: Literal["token", "sequence"] = "token"
    kl_coef: NonNegFloat = 0.0
    #: The KL(pi || pi_ref) estimator per token, d = log pi_ref - log pi:
    #: k1 = -d, k2 = d^2 / 2, k3 = exp(d) - 1 - d.
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    #: Clamp d to [-x, x] before the estimator (NeMo-RL's kl_input_clamp_value).
    kl_input_clamp: PosFloat | None = None
    #: Clamp the (weighted) per-token KL to [-x, x] (kl_output_clamp_value).
    kl_output_clamp: PosFloat | None = None
    #: Weight each token's KL by sg(pi / mu): unbiased for KL(pi || pi_ref) on
    #: tokens sampled from mu (NeMo-RL's use_on_policy_kl_approximation).
    on_policy_kl_approximation: bool = False
    off_policy_correction: Literal["none", "tis", "decoupled"] = "none"
    #: Cap of the truncated importance weights (tis and decoupled); None: no cap
    #: (NeMo-RL's importance sampling without a truncation ratio).
    is_cap: PosFloat | None = 2.0
    #: Bounds on pi_prox / mu per token or sequence (None: the correction's own
    #: token weight, min(rho, is_cap)).
    mismatch: MismatchConfig | None = None
    #: What a completion's reward is compared with: the mean of its group
    #: (GRPO), or the mean of the group's other completions (RLOO).
    baseline: Literal["group_mean", "leave_one_out"] = "group_mean"
    #: What the centred reward is divided by: the group's reward std (GRPO), the
    #: std of every reward of the step (TRL's scale_rewards: batch; the trainer
    #: then holds the step's groups until it ends), or nothing (Dr. GRPO).
    scale: Literal["group", "batch", "none"] = "group"
    #: How per-token losses become the step's loss: the mean over every trained
    #: token (DAPO), the mean over sequences of each sequence's token mean (GRPO's
    #: paper), or their sum over sequences x max_new_tokens (Dr. GRPO).
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = "token_mean"
    #: Weight of an entropy bonus (mean token entropy subtracted from the loss);
    #: keeps a policy trained from scratch exploring instead of collapsing early.
    entropy_coef: NonNegFloat = 0.0
    #: Tokens sampled more than this many versions before the step that trains
    #: them are left out of the policy-gradient loss (they still count in the
    #: group's rewards and advantage baseline). None: no bound. See
    #: docs/partial_rollouts.md.
    max_token_staleness: NonNegInt | None = None
    #: What a completion cut at max_new_tokens (finish_reason "length")
    #: contributes: keep (trained like any other), mask (its tokens left out of
    #: the loss; its reward still counts in the baseline) or zero_reward (trained
    #: with reward 0).
    truncated: Literal["keep", "mask", "zero_reward"] = "keep"
    #: DAPO's length penalty on the reward (None: off).
    overlong: OverlongConfig | None = None
    #: A linear rescale of the task's rewards before the above (None: off).
    reward_scaling: RewardScalingConfig | None = None

    @property
    def min_group_size(self) -> int:
        """The fewest completions per prompt the advantage can learn from.

        Both baselines are a group's (:func:`asyncrl.trainers.advantages.advantages`):
        the group's mean, or the mean of the other completions - 0 for every
        completion of a group of one, and undefined for leave-one-out. An
        advantage mode without a group baseline (a running mean, a value model)
        would answer 1 here; RunConfig refuses a smaller
        grpo.num_generations_per_prompt.
        """
        return 2

    @field_validator("clip_eps")
    @classmethod
    def _a_positive_lower_bound(cls, value: float) -> float:
        # The ratio pi / mu is positive: a lower bound 1 - clip_eps <= 0 never binds.
        if value >= 1:
            raise ValueError(
                f"clip_eps={value:g} puts the ratio's lower clip bound at 1 - {value:g} = "
                f"{1 - value:g}, and a ratio is never below 0: set clip_eps below 1 (0.2 is "
                "usual); clip_eps_high alone widens the upper bound")
        return value

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        # scale_advantages became `scale`: its old default (true, which every
        # config.yaml written before holds) means `scale: group`, the new default.
        if isinstance(data, dict) and "scale_advantages" in data:
            if data["scale_advantages"] is True and "scale" not in data:
                return {k: v for k, v in data.items() if k != "scale_advantages"}
            raise ValueError(
                "scale_advantages is an older asyncrl's key: write scale: group (true) or "
                "scale: none (false); scale: batch divides by the step's reward std")
        return data

    @model_validator(mode="after")
    def _meaningful(self) -> LossConfig:
        correction = self.off_policy_correction
        if self.dual_clip is not None and correction == "tis":
            raise ValueError(
                f"dual_clip={self.dual_clip:g} caps the PPO clip's loss, but "
                "off_policy_correction: tis has no clip; use none or decoupled, or drop dual_clip")
        mismatch = self.mismatch
        if mismatch is not None and mismatch.mode == "truncate":
            if correction == "none":
                raise ValueError(
                    "mismatch.mode: truncate bounds the behaviour weight pi_prox / mu, but "
                    "off_policy_correction: none has none (its ratio pi / mu carries the "
                    "mismatch itself); use decoupled (or tis), or mismatch.mode: drop")
            if self.is_cap != LossConfig.model_fields["is_cap"].default:
                raise ValueError(
                    f"is_cap={self.is_cap} and mismatch (mode: truncate) both bound "
                    "the behaviour weight; set the bound as mismatch.upper and leave is_cap out")
        if self.on_policy_kl_approximation and self.kl_coef == 0:
            raise ValueError(
                "on_policy_kl_approximation weights the KL term, but kl_coef is 0 (no KL "
                "term); set kl_coef > 0 or drop on_policy_kl_approximation")
        return self


__all__ = ["DualClip", "LossConfig", "MismatchConfig", "OverlongConfig", "RewardScalingConfig"]
