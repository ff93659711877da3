"""NeMo-RL's ``grpo``, ``loss_fn`` and ``policy.scheduler`` blocks, pasted as
written, load through the one key table (asyncrl.config.nemo_rl_keys): mapped
keys land on asyncrl's, keys asyncrl cannot honour are accepted switched off
and refused with one line otherwise.

The blocks are my own copies of the keys and values of NeMo-RL's public
``examples/configs/grpo_math_1B.yaml`` (v0.4.0 and today's) and of its GSPO and
DAPO recipes, comments left out.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import main
from asyncrl.config import config_from_dict, load_config
from asyncrl.config.nemo_rl_keys import NEMO_RL_RECIPE_KEYS
from asyncrl.errors import ConfigError

SCHEDULER = """
policy:
  scheduler:
    - name: "torch.optim.lr_scheduler.LinearLR"
      kwargs:
        start_factor: 0.1
        end_factor: 1.0
        total_iters: 50
    - name: "torch.optim.lr_scheduler.ConstantLR"
      kwargs:
        factor: 1.0
        total_iters: 10000000000
    - milestones: [50]
"""

V040 = """
grpo:
  num_prompts_per_step: 32
  num_generations_per_prompt: 16
  max_rollout_turns: 1
  max_num_epochs: 1
  max_num_steps: 1000000
  normalize_rewards: true
  use_leave_one_out_baseline: true
  val_period: 10
  val_at_start: false
  overlong_filtering: false
  max_val_samples: 256
  val_batch_size: 256
  seed: 42
  use_dynamic_sampling: false
  dynamic_sampling_max_gen_batches: 10
  batch_multiplier: 1
  reward_shaping:
    enabled: false
    overlong_buffer_length: 128
    overlong_buffer_penalty: 1
    max_response_length: ${policy.max_total_sequence_length}
  reward_scaling:
    enabled: false
    source_min: 0.0
    source_max: 1.0
    target_min: 0.0
    target_max: 1.0
  async_grpo:
    enabled: false
    max_trajectory_age_steps: 1
    in_flight_weight_updates: false
    recompute_kv_cache_after_weight_updates: false
loss_fn:
  reference_policy_kl_penalty: 0.01
  ratio_clip_min: 0.2
  ratio_clip_max: 0.2
  ratio_clip_c: null
  use_on_policy_kl_approximation: false
  use_importance_sampling_correction: false
  truncated_importance_sampling_ratio: null
  sequence_level_importance_ratios: false
  token_level_loss: true
""" + SCHEDULER

HEAD = """
grpo:
  num_prompts_per_step: 32
  num_generations_per_prompt: 16
  max_rollout_turns: 1
  max_num_epochs: 1
  max_num_steps: 1000000
  normalize_rewards: true
  use_leave_one_out_baseline: true
  val_period: 10
  val_start_at: -1
  val_at_start: false
  val_at_end: false
  overlong_filtering: false
  advantage_clip_low: null
  advantage_clip_high: null
  max_val_samples: 256
  val_num_generations_per_prompt: 1
  stop_at_validation_metric: null
  stop_at_validation_threshold: null
  val_batch_size: 256
  seed: 42
  use_dynamic_sampling: false
  dynamic_sampling_max_gen_batches: 10
  batch_multiplier: 1
  reward_shaping:
    enabled: false
    overlong_buffer_length: 128
    overlong_buffer_penalty: 1
    max_response_length: ${policy.max_total_sequence_length}
    stop_properly_penalty_coef: null
  adv_estimator:
    name: "grpo"
    normalize_rewards: ${grpo.normalize_rewards}
    use_leave_one_out_baseline: ${grpo.use_leave_one_out_baseline}
    minus_baseline: true
  reward_scaling:
    enabled: false
    source_min: 0.0
    source_max: 1.0
    target_min: 0.0
    target_max: 1.0
  seq_logprob_error_threshold: null
  invalid_tool_call_advantage: null
  malformed_thinking_advantage: null
  async_grpo:
    enabled: false
    max_trajectory_age_steps: 1
    max_generation_failures: 0
    in_flight_weight_updates: false
    recompute_kv_cache_after_weight_updates: false
loss_fn:
  reference_policy_kl_penalty: 0.01
  reference_policy_kl_type: "k3"
  kl_input_clamp_value: 20.0
  kl_output_clamp_value: 10.0
  ratio_clip_min: 0.2
  ratio_clip_max: 0.2
  ratio_clip_c: null
  use_on_policy_kl_approximation: false
  use_importance_sampling_correction: false
  truncated_importance_sampling_type: null
  truncated_importance_sampling_ratio: null
  truncated_importance_sampling_ratio_min: null
  sequence_level_importance_ratios: false
  token_level_loss: true
  force_on_policy_ratio: false
  use_kl_in_reward: false
  use_cispo: false
  disable_ppo_ratio: false
  positive_example_nll_weight: 0.0
""" + SCHEDULER

#: The GSPO recipe's override (grpo-gspo-deepscaler-1.5b-8K.yaml).
GSPO = """
grpo:
  num_prompts_per_step: 128
  num_generations_per_prompt: 8
  max_val_samples: 480
  val_batch_size: 32
loss_fn:
  reference_policy_kl_penalty: 0.0
  sequence_level_importance_ratios: true
  token_level_loss: false
"""

#: The DAPO recipe's grpo and loss_fn blocks (dapo-qwen2.5-7b.yaml), with its
#: dynamic sampling, over-sampling and reward scaling on.
DAPO = """
grpo:
  num_prompts_per_step: 512
  num_generations_per_prompt: 16
  batch_multiplier: 3
  max_rollout_turns: 1
  max_num_steps: 10000
  use_leave_one_out_baseline: false
  val_period: 20
  max_val_samples: 960
  val_batch_size: 960
  use_dynamic_sampling: true
  dynamic_sampling_max_gen_batches: 10
  reward_scaling:
    enabled: true
    source_min: 0.0
    source_max: 1.0
    target_min: -1.0
    target_max: 1.0
  reward_shaping:
    enabled: true
    overlong_buffer_length: 2048
    max_response_length: 14336
loss_fn:
  reference_policy_kl_penalty: 0.0
  ratio_clip_max: 0.28
  ratio_clip_c: 10
"""

#: DAPO's overlong penalty starts 2048 tokens before max_response_length=14336:
#: a generation limit past that start (the recipe's own, from its policy block).
DAPO_POLICY = {"generation": {"max_new_tokens": 14336},
               "model": {"max_position_embeddings": 16384}}

BLOCKS = {"v0.4.0": V040, "head": HEAD, "gspo": GSPO, "dapo": DAPO}


def loaded(text: str, tmp_path: Path, **extra):
    tree = yaml.safe_load(text)
    tree.update(extra)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    return load_config(path), path


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_pasted_blocks_load_and_validate(name, tmp_path: Path) -> None:
    # (NeMo-RL's steps of 512 x 16 completions need a buffer of their size, DAPO's
    # three times over)
    policy = {"policy": DAPO_POLICY} if name == "dapo" else {}
    cfg, path = loaded(BLOCKS[name], tmp_path, async_rl={"max_buffered_rollouts": 4096,
                                                         "max_inflight_prompts": 4096}, **policy)
    assert cfg.grpo.num_generations_per_prompt in (8, 16)
    assert main(["validate", "--config", str(path), "--json", "--no-memory"]) == 0


def test_the_math_blocks_land_on_asyncrls_keys(tmp_path: Path) -> None:
    cfg, _ = loaded(HEAD, tmp_path)
    loss = cfg.loss
    assert (loss.kl_coef, loss.kl_estimator, loss.kl_input_clamp, loss.kl_output_clamp) == \
        (0.01, "k3", 20.0, 10.0)
    assert (loss.clip_eps, loss.clip_eps_high, loss.dual_clip) == (0.2, 0.2, None)
    assert (loss.baseline, loss.scale, loss.aggregation) == ("leave_one_out", "group", "token_mean")
    assert loss.off_policy_correction == "none" and loss.truncated == "keep"
    assert cfg.seed == 42 and cfg.grpo.max_num_steps == 1000000
    assert len(cfg.policy.scheduler) == 3


def test_gspo_and_dapo_recipes(tmp_path: Path) -> None:
    gspo, _ = loaded(GSPO, tmp_path)
    assert (gspo.loss.ratio_level, gspo.loss.aggregation) == ("sequence", "sequence_mean")
    dapo, _ = loaded(DAPO, tmp_path, policy=DAPO_POLICY)
    assert (dapo.loss.clip_eps_high, dapo.loss.dual_clip) == (0.28, 10.0)
    assert dapo.loss.baseline == "group_mean"
    over = dapo.loss.overlong
    assert (over.buffer_tokens, over.penalty, over.max_tokens) == (2048, 1.0, 14336)
    dynamic = dapo.grpo.dynamic_sampling
    assert (dynamic.filter, dynamic.batch_multiplier, dynamic.max_gen_batches) == \
        ("zero_variance", 3.0, 10)
    scaling = dapo.loss.reward_scaling
    assert scaling is not None and [scaling.apply(r) for r in (-0.5, 0.0, 0.25, 1.0, 2.0)] == \
        [-1.0, -1.0, -0.5, 1.0, 1.0]


def test_dynamic_sampling_keys_take_effect_only_with_it_on() -> None:
    off = config_from_dict({"grpo": {"use_dynamic_sampling": False, "batch_multiplier": 1,
                                     "dynamic_sampling_max_gen_batches": 4}})
    assert off.grpo.dynamic_sampling == type(off.grpo.dynamic_sampling)()
    with pytest.raises(ConfigError, match=r"grpo\.batch_multiplier=2 over-samples for dynamic "
                                          r"sampling, which is off"):
        config_from_dict({"grpo": {"batch_multiplier": 2}})
    # asyncrl's own block and NeMo-RL's keys must agree
    with pytest.raises(ConfigError, match=r"sets grpo\.dynamic_sampling\.max_gen_batches=4, but "
                                          r"the config sets grpo\.dynamic_sampling\.max_gen_batches=2"):
        config_from_dict({"grpo": {"use_dynamic_sampling": True,
                                   "dynamic_sampling_max_gen_batches": 4,
                                   "dynamic_sampling": {"max_gen_batches": 2}}})


def test_reward_scaling_off_leaves_rewards_alone_and_a_bad_block_is_named() -> None:
    assert config_from_dict({"grpo": {"reward_scaling": {"enabled": False,
                                                         "target_min": -1.0}}}).loss.reward_scaling is None
    defaults = config_from_dict({"grpo": {"reward_scaling": {"enabled": True}}}).loss.reward_scaling
    assert defaults is not None and defaults.apply(0.3) == pytest.approx(0.3)
    with pytest.raises(ConfigError, match=r"grpo\.reward_scaling\.target_mid: unknown key"):
        config_from_dict({"grpo": {"reward_scaling": {"enabled": True, "target_mid": 0.0}}})
    with pytest.raises(ConfigError, match="source_max=0 must be above source_min=1"):
        config_from_dict({"grpo": {"reward_scaling": {"enabled": True, "source_min": 1.0,
                                                      "source_max": 0.0}}})


def test_max_sequence_length_reference_reads_as_max_new_tokens(tmp_path: Path) -> None:
    tree = yaml.safe_load(V040)
    tree["grpo"]["reward_shaping"]["enabled"] = True
    tree.setdefault("policy", {})["generation"] = {"max_new_tokens": 512}  # above the buffer
    cfg = config_from_dict(tree)
    assert cfg.loss.overlong.max_tokens is None  # policy.generation.max_new_tokens


def test_importance_sampling_correction_is_decoupled_with_its_cap() -> None:
    cfg = config_from_dict({"loss_fn": {"use_importance_sampling_correction": True,
                                        "truncated_importance_sampling_ratio": 5.0}})
    assert (cfg.loss.off_policy_correction, cfg.loss.is_cap) == ("decoupled", 5.0)
    uncapped = config_from_dict({"loss_fn": {"use_importance_sampling_correction": True}})
    assert uncapped.loss.is_cap == 2.0  # asyncrl's own default when the ratio is absent
    with pytest.raises(ConfigError, match="use_importance_sampling_correction is false"):
        config_from_dict({"loss_fn": {"truncated_importance_sampling_ratio": 5.0}})


def test_max_num_epochs_is_a_dataset_tasks_epochs(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2"}) + "\n")
    cfg = config_from_dict({"grpo": {"max_num_epochs": 3},
                            "task": {"name": "dataset", "path": str(data)}})
    assert cfg.task.epochs == 3
    assert config_from_dict({"grpo": {"max_num_epochs": 3}}).task.name == "arithmetic"


OFF_ONLY = [k for k in NEMO_RL_RECIPE_KEYS if k.fate == "off_only"]


def _on(value):
    if isinstance(value, dict):
        return {k: not v for k, v in value.items()}
    if isinstance(value, bool):
        return not value
    if value is None or value == "tis":
        return 0.5
    return value + 2


@pytest.mark.parametrize("row", OFF_ONLY, ids=[k.path for k in OFF_ONLY])
def test_keys_asyncrl_cannot_honour_are_refused_unless_off(row) -> None:
    block, key = row.path.split(".")
    assert config_from_dict({block: {key: row.off}}) is not None
    with pytest.raises(ConfigError) as err:
        config_from_dict({block: {key: _on(row.off)}})
    [line] = str(err.value).splitlines()
    assert f"{row.path}=" in line and "is refused" in line and row.note.split(";")[0] in line


def test_a_conflict_with_asyncrls_own_key_names_both() -> None:
    with pytest.raises(ConfigError, match=r"loss_fn.ratio_clip_min \(NeMo-RL's\) sets "
                                          r"loss.clip_eps=0.1, but the config sets loss.clip_eps=0.3"):
        config_from_dict({"loss_fn": {"ratio_clip_min": 0.1}, "loss": {"clip_eps": 0.3}})
    agree = config_from_dict({"loss_fn": {"ratio_clip_min": 0.1}, "loss": {"clip_eps": 0.1}})
    assert agree.loss.clip_eps == 0.1


def test_a_foreign_advantage_estimator_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"grpo\.adv_estimator=.* is refused"):
        config_from_dict({"grpo": {"adv_estimator": {"name": "reinforce_plus_plus"}}})


def test_every_refused_key_of_a_pasted_block_is_named_at_once() -> None:
    # Two keys asyncrl cannot honour and two unknown ones: four lines, one each,
    # so a user fixes the whole block in one pass rather than one run per key.
    rows = OFF_ONLY[:2]
    tree: dict = {}
    for row in rows:
        block, key = row.path.split(".")
        tree.setdefault(block, {})[key] = _on(row.off)
    tree.setdefault("loss_fn", {}).update({"ratio_clip_mid": 0.2, "no_such_key": 1})
    with pytest.raises(ConfigError) as err:
        config_from_dict(tree)
    lines = str(err.value).splitlines()
    assert len(lines) == 4, lines
    for row in rows:
        assert any(line.startswith(f"{row.path}=") and "is refused" in line for line in lines)
    assert any(line.startswith("loss_fn.ratio_clip_mid: unknown key") for line in lines)
    assert any(line.startswith("loss_fn.no_such_key: unknown key") for line in lines)


def test_an_unknown_loss_fn_key_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"loss_fn\.ratio_clip_mid: unknown key\. did you mean"):
        config_from_dict({"loss_fn": {"ratio_clip_mid": 0.2}})


@pytest.mark.e2e
def test_the_pasted_dapo_blocks_train_with_their_dynamic_sampling(tmp_path: Path) -> None:
    """NeMo-RL's DAPO blocks, at a tiny size: the filter drops groups without
    signal (the ledger counts them) and every step trains its full batch."""
    from asyncrl.run.train import train

    tree = yaml.safe_load(DAPO)
    tree["grpo"].update(num_prompts_per_step=2, num_generations_per_prompt=4, max_num_steps=3)
    tree["policy"] = {"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                "intermediate_size": 32, "max_position_embeddings": 16},
                      "generation": {"max_new_tokens": 2}}
    tree["async_rl"] = {"max_buffered_rollouts": 16, "max_inflight_prompts": 16}
    tree["logging"] = {"progress": "never", "tensorboard": False, "plots": False}
    summary = train(config_from_dict(tree), tmp_path / "run")
    ledger = summary["ledger"]
    assert summary["stop_reason"] == "max_num_steps" and ledger["balanced"]
    assert ledger["trained"] == 3 * 2 and ledger["filtered"] >= 0


@pytest.mark.e2e
def test_the_pasted_math_blocks_train(tmp_path: Path) -> None:
    from asyncrl.run.train import train

    tree = yaml.safe_load(HEAD)
    tree["grpo"].update(num_prompts_per_step=2, num_generations_per_prompt=2, max_num_steps=2)
    tree["policy"].update(model={"hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                 "intermediate_size": 32, "max_position_embeddings": 16},
                          train_mini_batches=2)
    tree["logging"] = {"progress": "never", "tensorboard": False, "plots": False}
    summary = train(config_from_dict(tree), tmp_path / "run")
    assert summary["stop_reason"] == "max_num_steps" and summary["ledger"]["balanced"]


@pytest.mark.parametrize(("kind", "low", "expected"), [
    ("tis", 0.5, {"level": "token", "mode": "truncate", "lower": 0.5, "upper": 2.0}),
    (None, 0.5, {"level": "token", "mode": "truncate", "lower": 0.5, "upper": 2.0}),
    ("icepop", 0.5, {"level": "token", "mode": "drop", "lower": 0.5, "upper": 2.0}),
    ("seq-mask-tis", 0.5, {"level": "sequence", "mode": "drop", "lower": 0.5, "upper": 2.0}),
])
def test_truncation_types_map_onto_loss_mismatch(kind, low, expected) -> None:
    cfg = config_from_dict({"loss_fn": {
        "use_importance_sampling_correction": True, "truncated_importance_sampling_type": kind,
        "truncated_importance_sampling_ratio": 2.0,
        "truncated_importance_sampling_ratio_min": low}})
    assert cfg.loss.mismatch.model_dump() == expected
    assert cfg.loss.off_policy_correction == "decoupled"
    assert cfg.loss.is_cap == (None if kind == "seq-mask-tis" else 2.0)


def test_a_truncation_type_without_the_correction_is_refused() -> None:
    with pytest.raises(ConfigError, match="needs use_importance_sampling_correction: true"):
        config_from_dict({"loss_fn": {"truncated_importance_sampling_type": "icepop",
                                      "truncated_importance_sampling_ratio_min": 0.5}})
    with pytest.raises(ConfigError, match="asyncrl knows tis, icepop, seq-mask-tis"):
        config_from_dict({"loss_fn": {"use_importance_sampling_correction": True,
                                      "truncated_importance_sampling_type": "cispo"}})
