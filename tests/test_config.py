"""The run config: YAML loading, overrides, and error messages that name the fix."""

from __future__ import annotations

import pytest

from asyncrl.config import RunConfig, apply_overrides, config_from_dict, load_config, parse_override
from asyncrl.errors import ConfigError


def test_defaults_are_valid() -> None:
    cfg = RunConfig()
    assert cfg.async_rl.sampler.name == "in_order"
    assert cfg.cluster.backend == "local"


def test_unknown_key_is_named_with_the_closest_valid_key() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"grpo": {"num_prompt_per_step": 4}})
    assert "grpo.num_prompt_per_step: unknown key" in str(err.value)
    assert "did you mean 'num_prompts_per_step'?" in str(err.value)


def test_unknown_top_level_block() -> None:
    with pytest.raises(ConfigError, match=r"asyncrl: unknown key. did you mean 'async_rl'"):
        config_from_dict({"asyncrl": {}})


def test_unknown_key_inside_a_sampler_names_the_sampler_path() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"async_rl": {"sampler": {"name": "in_order",
                                                   "max_staleness_versions": 1}}})
    text = str(err.value)
    assert "async_rl.sampler.max_staleness_versions: unknown key" in text
    assert "max_lookahead_versions" in text


def test_bad_type_names_the_field_and_the_value() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"grpo": {"max_num_steps": "many"}})
    assert "grpo.max_num_steps" in str(err.value) and "'many'" in str(err.value)


def test_bad_sampler_name_lists_the_valid_ones() -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"async_rl": {"sampler": {"name": "fifo"}}})
    assert "'fifo'" in str(err.value) and "'weight_fifo'" in str(err.value)


def test_negative_window_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_lookahead_versions"):
        config_from_dict({"async_rl": {"sampler": {"name": "in_order",
                                                   "max_lookahead_versions": -1}}})


def test_custom_sampler_keeps_extra_keys() -> None:
    cfg = config_from_dict({"async_rl": {"sampler": {"name": "custom", "target": "m:C", "k": 3}}})
    assert cfg.async_rl.sampler.kwargs == {"k": 3}


def test_deterministic_needs_the_local_backend() -> None:
    with pytest.raises(ConfigError, match="deterministic: true is supported on the local backend"):
        config_from_dict({"deterministic": True, "cluster": {"backend": "ray"}})


@pytest.mark.parametrize(
    ("text", "key", "value"),
    [
        ("grpo.max_num_steps=20", "grpo.max_num_steps", 20),
        ("policy.optimizer.lr=1e-3", "policy.optimizer.lr", 1e-3),
        ("async_rl.sampler.sample_freshest_first=true", "async_rl.sampler.sample_freshest_first", True),
        ("policy.model_name_or_path=/models/tiny", "policy.model_name_or_path", "/models/tiny"),
        ("async_rl.stall_timeout_s=null", "async_rl.stall_timeout_s", None),
        ("policy.optimizer.betas=[0.9, 0.95]", "policy.optimizer.betas", [0.9, 0.95]),
    ],
)
def test_override_parsing(text: str, key: str, value: object) -> None:
    assert parse_override(text) == (key, value)


@pytest.mark.parametrize("text", ["grpo.max_num_steps", "=3", "grpo..x=1", "a.b=[1"])
def test_malformed_overrides_are_explained(text: str) -> None:
    with pytest.raises(ConfigError, match="override"):
        parse_override(text)


def test_override_into_a_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="is a value, not a block"):
        apply_overrides({"seed": 1}, ["seed.x=2"])


def test_switching_sampler_by_override_drops_the_old_policys_keys(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("async_rl:\n  sampler: {name: in_order, max_lookahead_versions: 2}\n")
    cfg = load_config(path, ["async_rl.sampler.name=windowed",
                             "async_rl.sampler.max_staleness_versions=3"])
    assert cfg.async_rl.sampler.name == "windowed"
    assert cfg.async_rl.sampler.max_staleness_versions == 3


def test_load_config_errors(tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("grpo: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("3\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(scalar)


def test_examples_are_valid() -> None:
    from pathlib import Path

    examples = sorted(Path(__file__).resolve().parents[1].glob("examples/**/*.yaml"))
    assert examples, "examples/ must ship YAML configs"
    for path in examples:
        load_config(path)


def test_overriding_a_field_of_a_default_discriminated_block() -> None:
    cfg = load_config(None, ["task.max_operand=5", "async_rl.sampler.max_lookahead_versions=2"])
    assert cfg.task.name == "arithmetic" and cfg.task.max_operand == 5
    assert cfg.async_rl.sampler.max_lookahead_versions == 2
