"""NeMo-RL's ``async_rl`` blocks, pasted as they are, validate and train; the
keys asyncrl cannot honour are accepted switched off and refused otherwise;
``${a.b}`` references resolve after the overrides.

The blocks below are copies of the ``async_rl`` blocks of NeMo-RL's public
single-controller configs (plain config values, comments left out):
``examples/configs/grpo_math_1B_megatron_single_controller.yaml`` and the
recipes ``grpo-qwen2.5-math-1.5b-instruct-1n8g-megatron-single-controller-sync``
and ``grpo-llama3.1-8b-instruct-2n8g-async-1off-single-controller-streaming2``.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from asyncrl.cli import main
from asyncrl.config import AsyncRLConfig, config_from_dict, dump_config, load_config
from asyncrl.config.nemo_rl_keys import NEMO_RL_KEYS
from asyncrl.errors import ConfigError

EXEMPLAR = """
async_rl:
  sampler:
    name: in_order
    max_lookahead_versions: 1
  recompute_kv_cache_after_weight_updates: false
  min_groups_for_streaming_train: ${grpo.num_prompts_per_step}
  max_inflight_prompts: ${grpo.num_prompts_per_step}
  max_buffered_rollouts: 64
  diagnostics: false
  rollout_failure:
    max_infra_attempts_per_prompt: 5
    max_data_attempts_per_prompt: 2
    backoff_base_s: 1.0
    max_backoff_s: 30.0
    max_skipped_prompts: 0
    max_consecutive_dropped_prompts: 0
    min_step_batch_fraction: 0.9
    on_dropped_prompt: shrink
    max_replacement_attempts: 1
    replacement_reserve_prompts: 1
    native:
      generation_timeout_s: null
      env_timeout_s: null
    nemo_gym:
      rollout_timeout_s: null
      max_row_attempts: 3
  stall_watchdog:
    interval_s: 30.0
    stall_timeout_s: 600.0
    stall_action: warn
    gym_subprocess_check: true
  generation_fleet_health:
    enabled: false
    probe_interval_s: 5.0
    probe_timeout_s: 2.0
    unhealthy_threshold: 3
    healthy_threshold: 2
    selection: least_outstanding
    on_dead_shard: fail_fast
    max_restart_attempts_per_shard: 5
    min_healthy_shards: 1
    refit_timeout_s: 300.0
  generation_router:
    enabled: false
    port_range_low: 1202
    port_range_high: 1300
    backend_timeout_s: 600.0
    connect_timeout_s: 5.0
    no_healthy_backend_status: 409
"""

RECIPE_SYNC = """
async_rl:
  sampler:
    name: in_order
    max_lookahead_versions: 0
  recompute_kv_cache_after_weight_updates: true
  min_groups_for_streaming_train: ${grpo.num_prompts_per_step}
  max_inflight_prompts: ${grpo.num_prompts_per_step}
  max_buffered_rollouts: 32
"""

RECIPE_STREAMING = """
async_rl:
  sampler:
    name: windowed
    max_staleness_versions: 1
  min_groups_for_streaming_train: 16
  max_inflight_prompts: ${grpo.num_prompts_per_step}
  max_buffered_rollouts: 128
"""

BLOCKS = {"exemplar": EXEMPLAR, "sync": RECIPE_SYNC, "streaming": RECIPE_STREAMING}
#: The recipes' own batch sizes (the exemplar inherits 32 from grpo_math_1B.yaml).
GRPO = {"exemplar": 32, "sync": 32, "streaming": 64}


def pasted(name: str, **grpo) -> dict:
    tree = yaml.safe_load(BLOCKS[name])
    tree["grpo"] = {"num_prompts_per_step": GRPO[name], **grpo}
    return tree


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_pasted_blocks_validate_with_their_references_resolved(name, tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(pasted(name)))
    cfg = load_config(path)
    n = GRPO[name]
    assert cfg.async_rl.max_inflight_prompts == n
    if name != "streaming":
        assert cfg.async_rl.min_groups_for_streaming_train == n
    # `asyncrl validate` runs every check train runs, the setup validation included.
    assert main(["validate", "--config", str(path), "--json"]) == 0


@pytest.mark.e2e
def test_the_exemplar_block_trains(tmp_path: Path, capsys) -> None:
    from asyncrl.run.train import train

    tree = pasted("exemplar", num_generations_per_prompt=2, max_num_steps=2)
    tree["grpo"]["num_prompts_per_step"] = 4
    tree["policy"] = {"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2,
                                "intermediate_size": 32, "max_position_embeddings": 16}}
    tree["logging"] = {"progress": "never", "tensorboard": False, "plots": False}
    summary = train(config_from_dict(tree), tmp_path / "run")
    assert summary["stop_reason"] == "max_num_steps" and summary["ledger"]["balanced"]
    saved = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
    assert saved["async_rl"]["max_inflight_prompts"] == 4  # resolved, in the run's config


@pytest.mark.parametrize(("path", "value", "says"), [
    ("generation_fleet_health.enabled", True, "does not probe the health of a generation fleet"),
    ("generation_router.enabled", True, "NeMo-Gym, which asyncrl does not run"),
    ("rollout_failure.nemo_gym.rollout_timeout_s", 900.0, "no NeMo-Gym rollout path"),
    ("rollout_failure.nemo_gym.max_row_attempts", 5, "no NeMo-Gym rollout path"),
])
def test_keys_asyncrl_cannot_honour_are_refused_unless_off(path, value, says) -> None:
    tree = pasted("exemplar")
    node = tree["async_rl"]
    *parents, key = path.split(".")
    for part in parents:
        node = node[part]
    node[key] = value
    with pytest.raises(ConfigError, match=says) as err:
        config_from_dict(tree)
    assert len(str(err.value).splitlines()) == 1  # one line


def test_gym_subprocess_check_is_accepted_either_way() -> None:
    tree = pasted("exemplar")
    tree["async_rl"]["stall_watchdog"]["gym_subprocess_check"] = False
    assert config_from_dict(tree).async_rl.stall_watchdog.gym_subprocess_check is False


# ----------------------------------------------------------------- old keys
@pytest.mark.parametrize(("block", "new"), [
    ({"stall_timeout_s": 1800}, "stall_timeout_s is an older asyncrl's key: write stall_watchdog"),
    ({"rollout_failure": {"max_attempts": 3}}, "write max_infra_attempts_per_prompt and"),
    ({"rollout_failure": {"backoff_s": 0.5}}, "backoff_s is an older asyncrl's key: write "
                                              "backoff_base_s"),
    ({"rollout_failure": {"max_failed_groups": 16}}, "write max_skipped_prompts"),
])
def test_replaced_keys_get_one_line_naming_the_new_ones(block, new) -> None:
    with pytest.raises(ConfigError, match=new) as err:
        config_from_dict({"async_rl": block})
    assert len(str(err.value).splitlines()) == 1


def _tree_with(path: str, value: object = 1) -> dict:
    """A config whose async_rl block holds ``path`` (a path inside async_rl)."""
    node: dict = {}
    tree = {"async_rl": node}
    *parents, key = path.split(".")
    for part in parents:
        node[part] = {}
        node = node[part]
    node[key] = value
    return tree


STALE = [k for k in NEMO_RL_KEYS if k.refusal() is not None and k.root == "async_rl"]


@pytest.mark.parametrize("entry", STALE, ids=lambda k: k.path)
def test_every_stale_key_of_the_table_is_refused_naming_its_replacement(entry) -> None:
    # Issue 28, item 7: NeMo-RL's own renames got spelling guesses
    # (generation_timeout_s -> "did you mean generation_router") or nothing.
    if entry.path.startswith("sampler."):
        tree = _tree_with(entry.path)
        tree["async_rl"]["sampler"]["name"] = "in_order"
    else:
        tree = _tree_with(entry.path)
    with pytest.raises(ConfigError) as err:
        config_from_dict(tree)
    text = str(err.value)
    assert len(text.splitlines()) == 1, text
    where = ".".join(["async_rl", *filter(None, [entry.block])])
    assert f"{where}: {entry.refusal()}" in text, text
    assert "did you mean" not in text and "unknown key" not in text


@pytest.mark.parametrize(("path", "named"), [
    ("generation_timeout_s", "rollout_failure.native.generation_timeout_s"),
    ("env_timeout_s", "rollout_failure.native.env_timeout_s"),
    ("rollout_failure.max_attempts_per_prompt", "write max_infra_attempts_per_prompt"),
    ("rollout_failure.max_gym_row_attempts", "write nemo_gym.max_row_attempts"),
    ("rollout_failure.on_data_exhausted", "write max_skipped_prompts"),
])
def test_the_renames_the_issue_met_name_nemo_rls_replacement(path, named) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(_tree_with(path, "skip" if "exhausted" in path else 3))
    assert named in str(err.value) and "generation_router" not in str(err.value)


def _field_paths(model: type, prefix: str = "") -> set[str]:
    out = set()
    for name, field in model.model_fields.items():
        out.add(prefix + name)
        for sub in (field.annotation, *typing.get_args(field.annotation)):  # X | None too
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out |= _field_paths(sub, f"{prefix}{name}.")
    return out


def test_every_key_the_table_accepts_is_a_key_of_the_block() -> None:
    accepted = {k.path for k in NEMO_RL_KEYS if k.refusal() is None and k.root == "async_rl"}
    missing = accepted - _field_paths(AsyncRLConfig)
    assert not missing, f"the table accepts keys the config does not have: {missing}"
    # ... and every key of the block NeMo-RL has is in the table.
    ours_only = {"stall_watchdog", "rollout_failure", "rollout_failure.native",
                 "rollout_failure.nemo_gym"}
    assert {p for p in _field_paths(AsyncRLConfig)
            if not p.startswith(("generation_", "sampler.", "autopilot"))} - ours_only <= accepted


def test_max_backoff_below_the_base_is_refused() -> None:
    # Issue 18, item 13: it was accepted and silently won.
    with pytest.raises(ConfigError, match=r"max_backoff_s=0\.5 is below backoff_base_s=2"):
        config_from_dict({"async_rl": {"rollout_failure": {"backoff_base_s": 2.0,
                                                           "max_backoff_s": 0.5}}})


def test_watchdog_must_outlast_interval_and_deadlines() -> None:
    with pytest.raises(ConfigError, match="must be above interval_s=30"):
        config_from_dict({"async_rl": {"stall_watchdog": {"stall_timeout_s": 20.0}}})
    with pytest.raises(ConfigError, match=r"above rollout_failure\.native\.generation_timeout_s"):
        config_from_dict({"async_rl": {
            "stall_watchdog": {"stall_timeout_s": 100.0},
            "rollout_failure": {"native": {"generation_timeout_s": 120.0}}}})


# ------------------------------------------------------------ interpolation
def test_references_resolve_after_the_overrides(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(pasted("sync")))
    cfg = load_config(path, ["grpo.num_prompts_per_step=8"])
    assert cfg.async_rl.max_inflight_prompts == cfg.async_rl.min_groups_for_streaming_train == 8


def test_a_reference_to_an_unset_key_takes_its_default() -> None:
    tree = yaml.safe_load(RECIPE_SYNC)  # no grpo block: num_prompts_per_step is 8 by default
    tree["async_rl"]["max_buffered_rollouts"] = 8
    cfg = config_from_dict(tree)
    assert cfg.async_rl.max_inflight_prompts == 8
    assert cfg.grpo.num_prompts_per_step == 8


def test_a_missing_reference_names_the_key_and_the_closest_one() -> None:
    with pytest.raises(ConfigError, match=r"async_rl\.max_inflight_prompts: the reference "
                                          r"'\$\{grpo\.num_prompt_per_step\}' names grpo\."
                                          r"num_prompt_per_step, which is not a key of the "
                                          r"config; did you mean grpo\.num_prompts_per_step\?"):
        config_from_dict({"async_rl": {"max_inflight_prompts": "${grpo.num_prompt_per_step}"}})


def test_a_circular_reference_is_named() -> None:
    with pytest.raises(ConfigError, match="circular reference"):
        config_from_dict({"grpo": {"num_prompts_per_step": "${grpo.max_num_steps}",
                                   "max_num_steps": "${grpo.num_prompts_per_step}"}})


def test_an_escaped_reference_is_literal_text() -> None:
    cfg = config_from_dict({"task": {"name": "dataset", "path": "x.jsonl",
                                     "template": "Price: \\${amount}"}})
    assert cfg.task.template == "Price: ${amount}"


def test_validate_prints_the_resolved_config(tmp_path: Path, capsys) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(pasted("sync")))
    assert main(["validate", "--config", str(path), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["required_buffer_capacity"] == 32


def test_validate_warns_of_drop_budgets_the_step_floor_forbids(tmp_path: Path, capsys) -> None:
    tree = pasted("sync")  # 32 prompts per step: the default floor 0.9 leaves 29
    tree["grpo"]["num_prompts_per_step"] = 8  # a floor of 8: no step may shrink
    tree["async_rl"]["rollout_failure"] = {"max_skipped_prompts": 5}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert main(["validate", "--config", str(path)]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "warning: async_rl.rollout_failure.min_step_batch_fraction=0.9 makes the floor" in out
    assert "smallest step" in out and "8 groups" in out


# ------------------------------------------------------------ checkpointing
#: NeMo-RL's ``checkpointing`` block of ``examples/configs/grpo_math_1B.yaml``
#: (a copy of its public file at HEAD 7ea279abfbeb; v0.4.0 is the same less
#: ``save_optimizer``). NeMo-RL's checkpoint_dir is a path relative to its cwd.
CHECKPOINTING = """
checkpointing:
  enabled: true
  checkpoint_dir: "results/grpo"
  metric_name: "val:accuracy"
  higher_is_better: true
  keep_top_k: 3
  save_period: 10
  checkpoint_must_save_by: null
  model_save_format: "safetensors"
  save_consolidated: false
  save_optimizer: true
"""


def test_nemo_rls_checkpointing_block_is_read_into_checkpoint() -> None:
    cfg = config_from_dict(yaml.safe_load(CHECKPOINTING))
    c = cfg.checkpoint
    assert (c.every_steps, c.keep_last, c.save_optimizer, c.save_by) == (10, 1, True, None)
    assert c.keep_best is not None and c.keep_best.model_dump() == {
        "k": 3, "metric": "eval/pass@1", "mode": "max"}
    assert "checkpointing" not in yaml.safe_load(dump_config(cfg))  # the run's file: checkpoint


@pytest.mark.parametrize(("block", "expect"), [
    ({"save_period": 5, "higher_is_better": False, "metric_name": "train:total_reward/mean",
      "keep_top_k": 2}, {"every_steps": 5, "keep_last": 1,
                         "keep_best": {"k": 2, "metric": "reward_mean", "mode": "min"}}),
    ({"enabled": False, "save_period": 5}, {"every_steps": 0}),
    ({"keep_top_k": 4}, {"keep_last": 4}),  # no metric: NeMo-RL keeps the newest k
    ({"checkpoint_must_save_by": "00:03:45:00", "save_optimizer": False},
     {"save_by": "00:03:45:00", "save_optimizer": False}),
    ({"metric_name": "val:loss", "keep_top_k": 1, "higher_is_better": False},
     {"keep_best": {"k": 1, "metric": "eval/loss", "mode": "min"}}),
])
def test_each_checkpointing_key_maps_onto_checkpoint(block, expect) -> None:
    c = config_from_dict({"checkpointing": block}).checkpoint.model_dump()
    assert {k: c[k] for k in expect} == expect


CHECKPOINTING_REFUSED = [k for k in NEMO_RL_KEYS if k.root == "checkpointing" and k.refusal()]


@pytest.mark.parametrize("entry", CHECKPOINTING_REFUSED, ids=lambda k: k.path)
def test_every_refused_checkpointing_key_gets_its_one_line(entry) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"checkpointing": {entry.key: 1}})
    text = str(err.value)
    assert len(text.splitlines()) == 1 and f"checkpointing: {entry.refusal()}" in text, text


def test_every_checkpointing_key_the_table_accepts_is_a_field_and_back() -> None:
    from asyncrl.config.checkpoint import NemoRLCheckpointing

    accepted = {k.path for k in NEMO_RL_KEYS if k.root == "checkpointing" and not k.refusal()}
    assert accepted == set(NemoRLCheckpointing.model_fields)


@pytest.mark.parametrize(("block", "says"), [
    ({"checkpoint_must_save_by": 216000}, "quote it"),  # YAML 1.1's 1:00:00:00
    ({"metric_name": "val_reward", "keep_top_k": 1}, "'val:<name>'"),
    ({"save_period": 4, "unknown_key": 1}, "unknown key"),
])
def test_bad_checkpointing_values_get_one_line(block, says) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        config_from_dict({"checkpointing": block})
    assert len(str(err.value).splitlines()) == 1


def test_a_key_set_in_both_blocks_is_refused() -> None:
    with pytest.raises(ConfigError, match="set by both"):
        config_from_dict({"checkpoint": {"every_steps": 3}, "checkpointing": {"save_period": 5}})
    both = config_from_dict({"checkpoint": {"every_minutes": 30.0},
                             "checkpointing": {"save_period": 5}}).checkpoint
    assert (both.every_steps, both.every_minutes) == (5, 30.0)


@pytest.mark.e2e
def test_the_grpo_math_1b_checkpointing_block_validates_and_trains(tmp_path: Path) -> None:
    """Pasted into a small config with an evaluation (NeMo-RL validates every
    val_period steps; asyncrl's eval block is off unless set): val:accuracy is
    eval/pass@1, which needs two or more eval completions per prompt."""
    from asyncrl.run.train import train

    tree = yaml.safe_load(CHECKPOINTING)
    tree["checkpointing"]["save_period"] = 1
    tree.update(
        grpo={"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 5},
        async_rl={"max_inflight_prompts": 2, "min_groups_for_streaming_train": 2,
                  "max_buffered_rollouts": 4},
        policy={"model": {"hidden_size": 16, "num_layers": 1, "num_heads": 2,
                          "intermediate_size": 32, "max_position_embeddings": 16}},
        eval={"every_steps": 1, "num_prompts": 4, "num_generations": 2, "temperature": 1.0},
        logging={"progress": "never", "tensorboard": False, "plots": False})
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(tree))
    assert main(["validate", "--config", str(path)]) == 0
    summary = train(load_config(path), tmp_path / "run")
    assert summary["stop_reason"] == "max_num_steps" and summary["ledger"]["balanced"]
    kept = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    assert "step-000005" in kept and len(kept) <= 4  # the newest and the best 3
    assert summary["best_checkpoint"]["metric"] == "eval/pass@1"
