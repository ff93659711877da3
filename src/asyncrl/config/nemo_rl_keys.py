"""NeMo-RL's ``async_rl`` and ``checkpointing`` keys and what asyncrl does with each: one table.

:data:`NEMO_RL_KEYS` is the one list of them. The config blocks read their
refusals from it (:class:`RefusesRenamedKeys`): a key NeMo-RL renamed is
refused with one line naming the key that replaced it - never with a
"did you mean" guess by spelling, which for ``generation_timeout_s`` would
name ``generation_router``. docs/training.md shows the table as
:func:`table_rows` renders it (tests/test_docs.py checks that they agree), and
tests/test_nemo_rl_compat.py checks every row against the config blocks.

The renames are NeMo-RL's own (its ``single_controller_utils/config.py``
refuses the old names the same way): the fault-tolerance keys it moved from
``async_rl`` into ``rollout_failure``, the blocks it renamed, and the keys of
``rollout_failure`` it replaced. Keys of an older asyncrl are in the table too,
so that one mechanism refuses every stale key.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal, NamedTuple

from pydantic import BaseModel, model_validator

Fate = Literal["implemented", "at_default", "no_effect", "off_only", "renamed",
               "old_asyncrl", "refused", "mapped", "ignored"]


class NemoRLKey(NamedTuple):
    """One key: its path inside its NeMo-RL block ``root``, what asyncrl does with it,
    and the detail that completes it - the replacement of a renamed key (a path inside
    the key's own block), the reason of a refused or ignored one, the value an
    ``at_default`` key must have, the asyncrl key a ``mapped`` one is read as."""

    path: str
    fate: Fate
    detail: str = ""
    root: str = "async_rl"

    @property
    def block(self) -> str:
        """The path of the block the key is in ("" for ``async_rl`` itself)."""
        return self.path.rpartition(".")[0]

    @property
    def key(self) -> str:
        return self.path.rpartition(".")[2]

    def refusal(self) -> str | None:
        """The line a config holding this key gets (None: asyncrl takes the key)."""
        if self.fate == "renamed":
            return f"{self.key} is NeMo-RL's old name: write {self.detail}"
        if self.fate == "old_asyncrl":
            return f"{self.key} is an older asyncrl's key: write {self.detail}"
        if self.fate == "refused":
            return f"{self.key}: {self.detail}"
        return None

    def _in_block(self, text: str) -> str:
        return f"{self.block}.{text}" if self.block else text

    def meaning(self) -> str:
        """What docs/training.md says of the key."""
        return {
            "implemented": "implemented",
            "at_default": f"accepted at NeMo-RL's default ({self.detail}) only: a NeMo-Gym "
                          "path, which asyncrl does not have",
            "no_effect": "accepted either way, no effect (NeMo-Gym only)",
            "off_only": "accepted with `enabled: false` only (its other keys are kept and do "
                        f"nothing); `enabled: true` is refused: {self.detail}",
            "renamed": f"renamed by NeMo-RL to {self._in_block(self.detail)}: refused with "
                       "one line naming it",
            "old_asyncrl": f"an older asyncrl's key, replaced by {self._in_block(self.detail)}: "
                           "refused with one line naming it",
            "refused": f"refused with one line: {self.detail}",
            "mapped": f"read as {self.detail}",
            "ignored": f"accepted, no effect: {self.detail}",
        }[self.fate]

    @property
    def shown(self) -> str:
        """The key as the table shows it: inside ``async_rl``, or with its block."""
        return self.path if self.root == "async_rl" else f"{self.root}.{self.path}"


def _implemented(block: str, *keys: str) -> list[NemoRLKey]:
    return [NemoRLKey(f"{block}.{k}" if block else k, "implemented") for k in keys]


def _ckpt(path: str, fate: Fate, detail: str) -> NemoRLKey:
    return NemoRLKey(path, fate, detail, root="checkpointing")


#: NeMo-RL's ``checkpointing`` block (its ``CheckpointingConfig``), read by
#: :class:`asyncrl.config.checkpoint.NemoRLCheckpointing`.
CHECKPOINTING_KEYS: tuple[NemoRLKey, ...] = (
    _ckpt("enabled", "mapped", "`true`: as configured; `false`: `checkpoint.every_steps: 0` "
          "and `every_minutes: 0` (no periodic checkpoints; the one a run stops with, which "
          "a resume needs, is still written)"),
    _ckpt("checkpoint_dir", "ignored", "checkpoints are written to `RUN_DIR/checkpoints/`, "
          "where `--resume` and `asyncrl export` find them; choose the place with `--run-dir`"),
    _ckpt("save_period", "mapped", "`checkpoint.every_steps`"),
    _ckpt("metric_name", "mapped", "`checkpoint.keep_best.metric` (`val:accuracy` is "
          "`eval/pass@1`, `val:total_reward/mean` is `eval/reward_mean`, "
          "`train:total_reward/mean` is `reward_mean`, any other `val:X` is `eval/X` and "
          "`train:X` is `train/X`)"),
    _ckpt("higher_is_better", "mapped", "`checkpoint.keep_best.mode` (`max` / `min`)"),
    _ckpt("keep_top_k", "mapped", "`checkpoint.keep_best.k`, with `checkpoint.keep_last: 1` "
          "(the best k and the newest); without `metric_name`: `checkpoint.keep_last`"),
    _ckpt("ft_keep_latest_k", "mapped", "`checkpoint.keep_last`"),
    _ckpt("checkpoint_must_save_by", "mapped", "`checkpoint.save_by` (an unquoted value "
          "YAML reads as a number is refused: quote it)"),
    _ckpt("save_optimizer", "mapped", "`checkpoint.save_optimizer`"),
    _ckpt("model_save_format", "ignored", "checkpoints are torch files whose bytes a sha256 "
          "guards; `final/` and `asyncrl export` write safetensors"),
    _ckpt("save_consolidated", "ignored", "`final/` and `asyncrl export` write the whole "
          "(consolidated) Hugging Face model"),
    _ckpt("is_async", "ignored", "the checkpoint write is always off the training path"),
    _ckpt("ft_save_period", "refused", "asyncrl has one period, and every checkpoint resumes "
          "exactly: use save_period"),
    _ckpt("pretrained_checkpoint", "refused", "start from a model with "
          "policy.model_name_or_path; continue a run with asyncrl train --resume RUN_DIR"),
    _ckpt("model_cache_dir", "refused", "models are read from policy.model_name_or_path, "
          "a local directory (never downloaded)"),
    _ckpt("model_repo_id", "refused", "models are read from policy.model_name_or_path, "
          "a local directory (never downloaded)"),
    _ckpt("is_peft", "refused", "LoRA is the policy.lora block"),
    _ckpt("peft_config", "refused", "LoRA is the policy.lora block"),
)

#: Every key of NeMo-RL's ``async_rl`` block (and the stale ones it or asyncrl refuses).
NEMO_RL_KEYS: tuple[NemoRLKey, ...] = (
    *_implemented("", "sampler", "max_buffered_rollouts", "min_groups_for_streaming_train",
                  "max_inflight_prompts", "recompute_kv_cache_after_weight_updates",
                  "diagnostics"),
    *_implemented("rollout_failure", "max_infra_attempts_per_prompt",
                  "max_data_attempts_per_prompt", "backoff_base_s", "max_backoff_s",
                  "max_skipped_prompts", "max_consecutive_dropped_prompts",
                  "min_step_batch_fraction", "on_dropped_prompt", "max_replacement_attempts",
                  "replacement_reserve_prompts"),
    *_implemented("rollout_failure.native", "generation_timeout_s", "env_timeout_s"),
    *_implemented("stall_watchdog", "interval_s", "stall_timeout_s", "stall_action"),
    NemoRLKey("rollout_failure.nemo_gym.rollout_timeout_s", "at_default", "`null`"),
    NemoRLKey("rollout_failure.nemo_gym.max_row_attempts", "at_default", "`3`"),
    NemoRLKey("stall_watchdog.gym_subprocess_check", "no_effect"),
    NemoRLKey("generation_fleet_health", "off_only",
              "the Ray backend restarts dead workers itself (`cluster.max_worker_restarts`)"),
    NemoRLKey("generation_router", "off_only", "the router serves NeMo-Gym"),
    NemoRLKey("sampler.warmup_lookahead_versions", "refused",
              "NeMo-RL widens the lookahead with it while a PPO critic warms up; asyncrl "
              "trains GRPO, without a critic: remove it"),
    # NeMo-RL's renames: blocks renamed, deadlines moved into rollout_failure.
    NemoRLKey("watchdog", "renamed", "stall_watchdog"),
    NemoRLKey("fleet_health", "renamed", "generation_fleet_health"),
    NemoRLKey("policy_router", "renamed", "generation_router"),
    NemoRLKey("generation_timeout_s", "renamed", "rollout_failure.native.generation_timeout_s"),
    NemoRLKey("env_timeout_s", "renamed", "rollout_failure.native.env_timeout_s"),
    NemoRLKey("rollout_timeout_s", "renamed", "rollout_failure.nemo_gym.rollout_timeout_s"),
    NemoRLKey("rollout_failure.max_attempts_per_prompt", "renamed",
              "max_infra_attempts_per_prompt"),
    NemoRLKey("rollout_failure.on_data_exhausted", "renamed",
              "max_skipped_prompts (0 is the old fail_fast; skip is a budget of prompts, "
              "e.g. 100)"),
    NemoRLKey("rollout_failure.max_gym_row_attempts", "renamed", "nemo_gym.max_row_attempts"),
    # An older asyncrl's keys.
    NemoRLKey("stall_timeout_s", "old_asyncrl",
              "stall_watchdog: {stall_timeout_s: ..., stall_action: abort}"),
    NemoRLKey("rollout_failure.max_attempts", "old_asyncrl",
              "max_infra_attempts_per_prompt and max_data_attempts_per_prompt"),
    NemoRLKey("rollout_failure.backoff_s", "old_asyncrl", "backoff_base_s"),
    NemoRLKey("rollout_failure.max_failed_groups", "old_asyncrl",
              "max_skipped_prompts (data) and max_consecutive_dropped_prompts (infra)"),
    *CHECKPOINTING_KEYS,
)


def refusals(block: str, root: str = "async_rl") -> dict[str, str]:
    """The keys refused in ``block`` (a path inside ``root``), each with its line."""
    return {k.key: line for k in NEMO_RL_KEYS
            if k.root == root and k.block == block and (line := k.refusal()) is not None}


def table_rows() -> list[tuple[str, str]]:
    """The table of docs/training.md: (keys, meaning) rows, keys of one meaning
    together, in the order of :data:`NEMO_RL_KEYS`."""
    rows: dict[str, list[str]] = {}
    for k in NEMO_RL_KEYS:
        rows.setdefault(k.meaning(), []).append(f"`{k.shown}`")
    return [(", ".join(paths), meaning) for meaning, paths in rows.items()]


class RefusesRenamedKeys(BaseModel):
    """A config block that refuses the stale keys :data:`NEMO_RL_KEYS` lists for it
    (``nemo_rl_block``: its path inside ``async_rl``) with one line each, naming
    what replaced them: a config must never keep parsing while a setting it asks
    for silently stops taking effect."""

    nemo_rl_block: ClassVar[str] = ""
    #: The NeMo-RL block ``nemo_rl_block`` is a path inside.
    nemo_rl_root: ClassVar[str] = "async_rl"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            stale = [line for key, line in refusals(cls.nemo_rl_block, cls.nemo_rl_root).items()
                     if key in data]
            if stale:
                raise ValueError("; ".join(stale)
                                 + f" (see docs/training.md, {cls.nemo_rl_root})")
        return data


# ------------------------------------------------------ grpo, loss_fn, policy
RecipeFate = Literal["native", "mapped", "off_only", "no_effect"]


class RecipeKey(NamedTuple):
    """One key of NeMo-RL's ``grpo`` or ``loss_fn`` block (its full path) and what
    asyncrl does with it (:mod:`asyncrl.config.nemo_rl_recipes` applies the row):

    * ``native``: the same key, same meaning, in asyncrl's own block;
    * ``mapped``: written onto ``target`` (an asyncrl path), ``note`` says how;
    * ``off_only``: accepted at ``off`` (NeMo-RL's value that switches it off),
      refused otherwise with ``note`` (why asyncrl cannot honour it yet);
    * ``no_effect``: accepted whatever its value, ``note`` says why it changes nothing.
    """

    path: str
    fate: RecipeFate
    target: str = ""
    note: str = ""
    off: Any = None

    def meaning(self) -> str:
        """What docs/recipes.md says of the key."""
        if self.fate == "native":
            return "the same key in asyncrl"
        if self.fate == "mapped":
            return f"`{self.target}`: {self.note}"
        if self.fate == "off_only":
            return f"accepted at `{_yaml(self.off)}` only; otherwise refused: {self.note}"
        return f"accepted, no effect: {self.note}"


def _yaml(value: Any) -> str:
    return json.dumps(value).replace('"', "")


_NO_ADV_EDIT = "asyncrl does not rewrite advantages after the baseline yet"

#: NeMo-RL's ``grpo`` and ``loss_fn`` keys (v0.4.0's grpo_math_1B.yaml and
#: today's), in the order of its file.
NEMO_RL_RECIPE_KEYS: tuple[RecipeKey, ...] = (
    RecipeKey("grpo.num_prompts_per_step", "native"),
    RecipeKey("grpo.num_generations_per_prompt", "native"),
    RecipeKey("grpo.max_rollout_turns", "off_only", off=1,
              note="multi-turn rollouts are a task's own `task.rollout` in asyncrl"),
    RecipeKey("grpo.max_num_epochs", "mapped", "task.epochs",
              "passes over a dataset task's records; a built-in task is an endless stream "
              "(no epochs), where only `max_num_steps` ends the run"),
    RecipeKey("grpo.max_num_steps", "native"),
    RecipeKey("grpo.normalize_rewards", "mapped", "loss.scale",
              "true: `group` (divide by the group's reward std), false: `none`"),
    RecipeKey("grpo.use_leave_one_out_baseline", "mapped", "loss.baseline",
              "true: `leave_one_out`, false: `group_mean`; asyncrl's std is the whole "
              "group's, NeMo-RL's the other completions'"),
    RecipeKey("grpo.val_period", "no_effect", note="held-out evaluation is asyncrl's `eval` block"),
    RecipeKey("grpo.val_start_at", "no_effect", note="see `eval`"),
    RecipeKey("grpo.val_at_start", "no_effect", note="see `eval`"),
    RecipeKey("grpo.val_at_end", "no_effect", note="see `eval`"),
    RecipeKey("grpo.max_val_samples", "no_effect", note="see `eval.num_prompts`"),
    RecipeKey("grpo.val_batch_size", "no_effect", note="see `eval`"),
    RecipeKey("grpo.val_num_generations_per_prompt", "no_effect",
              note="see `eval.num_generations`"),
    RecipeKey("grpo.stop_at_validation_metric", "off_only",
              note="asyncrl does not stop on an eval metric yet"),
    RecipeKey("grpo.stop_at_validation_threshold", "off_only",
              note="asyncrl does not stop on an eval metric yet"),
    RecipeKey("grpo.overlong_filtering", "mapped", "loss.truncated",
              "true: `mask` (truncated completions out of the loss, in the baseline); false: "
              "asyncrl's own setting"),
    RecipeKey("grpo.advantage_clip_low", "off_only", note=_NO_ADV_EDIT),
    RecipeKey("grpo.advantage_clip_high", "off_only", note=_NO_ADV_EDIT),
    RecipeKey("grpo.seed", "mapped", "seed", "the run's seed"),
    RecipeKey("grpo.use_dynamic_sampling", "mapped", "grpo.dynamic_sampling.filter",
              "true: `zero_variance` (a group whose rewards are all equal is filtered when "
              "it is committed, and replaced); false: asyncrl's own setting"),
    RecipeKey("grpo.dynamic_sampling_max_gen_batches", "mapped",
              "grpo.dynamic_sampling.max_gen_batches",
              "with `use_dynamic_sampling: true` (the filter's budget); no effect otherwise"),
    RecipeKey("grpo.batch_multiplier", "mapped", "grpo.dynamic_sampling.batch_multiplier",
              "with `use_dynamic_sampling: true` (groups admitted per step, as a multiple "
              "of `num_prompts_per_step`); otherwise it must be 1, as NeMo-RL requires"),
    RecipeKey("grpo.reward_shaping", "mapped", "loss.overlong",
              "`enabled: true`: DAPO's overlong penalty, `{buffer_tokens: "
              "overlong_buffer_length, penalty: overlong_buffer_penalty, max_tokens: "
              "max_response_length}` (`${policy.max_total_sequence_length}` reads as "
              "`policy.generation.max_new_tokens`); `stop_properly_penalty_coef` must be null"),
    RecipeKey("grpo.adv_estimator", "no_effect",
              note="accepted with `name: grpo`, `minus_baseline: true` and the block's own "
                   "`normalize_rewards` / `use_leave_one_out_baseline`; otherwise refused"),
    RecipeKey("grpo.reward_scaling", "mapped", "loss.reward_scaling",
              "`enabled: true`: `{source_min, source_max, target_min, target_max}` (NeMo-RL's "
              "defaults 0, 1, 0, 1 where absent): rewards clamped to the source range and "
              "mapped linearly onto the target range, before `reward_shaping`"),
    RecipeKey("grpo.seq_logprob_error_threshold", "off_only",
              note="asyncrl does not mask sequences by their log-prob error yet"),
    RecipeKey("grpo.invalid_tool_call_advantage", "off_only", note=_NO_ADV_EDIT),
    RecipeKey("grpo.malformed_thinking_advantage", "off_only", note=_NO_ADV_EDIT),
    RecipeKey("grpo.async_grpo", "off_only", off={"enabled": False},
              note="asyncrl is asynchronous by itself: configure `async_rl` "
                   "(`enabled: false`, other keys kept)"),
    RecipeKey("loss_fn.reference_policy_kl_penalty", "mapped", "loss.kl_coef", "the same"),
    RecipeKey("loss_fn.reference_policy_kl_type", "mapped", "loss.kl_estimator", "the same"),
    RecipeKey("loss_fn.kl_input_clamp_value", "mapped", "loss.kl_input_clamp", "the same"),
    RecipeKey("loss_fn.kl_output_clamp_value", "mapped", "loss.kl_output_clamp", "the same"),
    RecipeKey("loss_fn.ratio_clip_min", "mapped", "loss.clip_eps", "the same"),
    RecipeKey("loss_fn.ratio_clip_max", "mapped", "loss.clip_eps_high", "the same"),
    RecipeKey("loss_fn.ratio_clip_c", "mapped", "loss.dual_clip", "the same"),
    RecipeKey("loss_fn.use_on_policy_kl_approximation", "mapped",
              "loss.on_policy_kl_approximation", "the same"),
    RecipeKey("loss_fn.use_importance_sampling_correction", "mapped",
              "loss.off_policy_correction",
              "true: `decoupled` (clip around pi_prox, weight pi_prox / mu); false: asyncrl's "
              "own setting (default `none`, the ratio against mu: NeMo-RL's ratio against "
              "pi_prox without a weight has no asyncrl equivalent)"),
    RecipeKey("loss_fn.truncated_importance_sampling_type", "mapped", "loss.mismatch",
              "null or `tis` with a `_ratio_min`: `{level: token, mode: truncate, lower: "
              "ratio_min, upper: ratio}`; `icepop`: `{level: token, mode: drop, ...}`; "
              "`seq-mask-tis`: `{level: sequence, mode: drop, ...}` (kept tokens uncapped); "
              "each needs `use_importance_sampling_correction: true`"),
    RecipeKey("loss_fn.truncated_importance_sampling_ratio", "mapped", "loss.is_cap",
              "with `use_importance_sampling_correction: true` (null: no cap); the upper "
              "bound of `loss.mismatch` when a type or `_ratio_min` makes one"),
    RecipeKey("loss_fn.truncated_importance_sampling_ratio_min", "mapped", "loss.mismatch",
              "the lower bound (see `truncated_importance_sampling_type`)"),
    RecipeKey("loss_fn.sequence_level_importance_ratios", "mapped", "loss.ratio_level",
              "true: `sequence` (GSPO; asyncrl's behaviour weight is the geometric mean, "
              "NeMo-RL's the product); false: `token`"),
    RecipeKey("loss_fn.token_level_loss", "mapped", "loss.aggregation",
              "true: `token_mean`, false: `sequence_mean`"),
    RecipeKey("loss_fn.force_on_policy_ratio", "off_only", off=False,
              note="not in asyncrl"),
    RecipeKey("loss_fn.use_kl_in_reward", "off_only", off=False, note="not in asyncrl"),
    RecipeKey("loss_fn.use_cispo", "off_only", off=False, note="CISPO is not in asyncrl"),
    RecipeKey("loss_fn.disable_ppo_ratio", "off_only", off=False, note="not in asyncrl"),
    RecipeKey("loss_fn.positive_example_nll_weight", "off_only", off=0.0,
              note="not in asyncrl"),
)


def recipe_table_rows() -> list[tuple[str, str]]:
    """The recipe table of docs/recipes.md: (key, meaning) rows."""
    return [(f"`{k.path}`", k.meaning()) for k in NEMO_RL_RECIPE_KEYS]


__all__ = ["CHECKPOINTING_KEYS", "NEMO_RL_KEYS", "NEMO_RL_RECIPE_KEYS", "NemoRLKey", "RecipeKey",
           "RefusesRenamedKeys", "recipe_table_rows", "refusals", "table_rows"]
