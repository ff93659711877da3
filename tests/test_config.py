"""The run config: YAML loading, overrides, and error messages that name the fix."""

from __future__ import annotations

import pytest

from asyncrl.config import RunConfig, apply_overrides, config_from_dict, load_config, parse_override
from asyncrl.config.load import set_overrides
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


@pytest.mark.parametrize(("data", "field"), [
    ({"seed": -1}, "seed"), ({"policy": {"vllm": {"seed": -3}}}, "policy.vllm.seed")])
def test_a_negative_seed_is_one_line_naming_the_field(data: dict, field: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    text = str(err.value)
    assert f"{field}: Input should be greater than or equal to 0" in text and "\n" not in text


def test_seed_zero_and_an_unset_engine_seed_are_valid() -> None:
    cfg = config_from_dict({"seed": 0, "policy": {"vllm": {"seed": None}}})
    assert cfg.seed == 0 and cfg.policy.vllm.seed is None


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
        ("async_rl.stall_watchdog=null", "async_rl.stall_watchdog", None),
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
    with pytest.raises(ConfigError, match="not valid YAML") as err:
        load_config(bad)
    # The line it points at names the file, not PyYAML's "<unicode string>".
    assert f'in "{bad}", line 1' in str(err.value) and "<unicode string>" not in str(err.value)
    bad.write_text("seed: 1\x07\n")  # a control character: refused before parsing starts
    with pytest.raises(ConfigError, match="not valid YAML") as err:
        load_config(bad)
    assert f'in "{bad}", position 7' in str(err.value), str(err.value)
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


# ------------------------------------------------ issue 12, case 10: strict loading
def test_an_empty_file_is_an_error_that_says_what_to_put_in_it(tmp_path) -> None:
    for text in ("", "# only a comment\n"):
        path = tmp_path / "empty.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError, match="is empty") as err:
            load_config(path)
        assert "grpo: {max_num_steps: 50}" in str(err.value) and "write {}" in str(err.value)
    path.write_text("{}\n")
    assert load_config(path) == RunConfig()


def test_a_duplicate_key_names_the_key_and_both_lines(tmp_path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("seed: 1\npolicy:\n  optimizer:\n    lr: 0.1\n    lr: 0.2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "key 'lr' appears twice" in str(err.value)
    assert "on line 4 and on line 5" in str(err.value)
    # The same key in two different blocks is fine, and so is a merge key's override.
    path.write_text("task: {name: arithmetic, num_prompts: 4}\n"
                    "grpo: {num_prompts_per_step: 4}\n")
    assert load_config(path).task.num_prompts == 4
    from asyncrl.config.strict_yaml import load_yaml

    assert load_yaml("a: &x {k: 1, j: 2}\nb: {<<: *x, k: 3}\n", "t")["b"] == {"k": 3, "j": 2}


@pytest.mark.parametrize("key", ["grpo.num_prompts_per_step", "policy.optimizer.lr",
                                 "seed", "async_rl.sampler.max_lookahead_versions"])
def test_a_boolean_where_a_number_is_expected_is_an_error(key) -> None:
    with pytest.raises(ConfigError, match="a boolean where a number is expected"):
        load_config(None, [f"{key}=true"])


def test_yaml_ints_still_fill_float_fields(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("policy: {optimizer: {lr: 1, betas: [1, 0]}}\nloss: {kl_coef: 0}\n")
    cfg = load_config(path)
    assert cfg.policy.optimizer.lr == 1.0 and isinstance(cfg.policy.optimizer.lr, float)
    assert cfg.policy.optimizer.betas == (1.0, 0.0)


@pytest.mark.parametrize(("block", "typo", "meant"), [
    ("async_rl.sampler", "windowd", "windowed"),
    ("async_rl.sampler", "wieght_fifo", "weight_fifo"),
    ("task", "arithmetc", "arithmetic"),
])
def test_sampler_and_task_name_typos_get_did_you_mean(tmp_path, block, typo, meant) -> None:
    outer, *inner = block.split(".")
    tree: dict = {"name": typo}
    for part in reversed(inner):
        tree = {part: tree}
    with pytest.raises(ConfigError) as err:
        config_from_dict({outer: tree})
    assert f"{block}.name: unknown name '{typo}'; did you mean '{meant}'?" in str(err.value)


@pytest.mark.parametrize(("typo", "meant"), [("vlm", "vllm"), ("vllm_sever", "vllm_server"),
                                             ("locl", "local")])
def test_an_engine_name_typo_gets_did_you_mean_as_sampler_names_do(typo, meant) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"policy.engine={typo}"])
    text = str(err.value)
    assert (f"policy.engine: Input should be 'local', 'vllm', 'vllm_server' or 'custom' "
            f"(got '{typo}'); did you mean '{meant}'?") in text, text
    with pytest.raises(ConfigError) as err:  # nothing close: the choices alone
        load_config(None, ["policy.engine=tensorrt"])
    assert "(got 'tensorrt')" in str(err.value) and "did you mean" not in str(err.value)


@pytest.mark.parametrize("how", ["file", "override"])
def test_a_target_without_a_class_names_the_target_and_the_form(tmp_path, how) -> None:
    path = tmp_path / "c.yaml"
    if how == "file":
        path.write_text('async_rl:\n  sampler: {name: custom, target: "mysamp:"}\n')
        overrides = []
    else:
        path.write_text("async_rl:\n  sampler: {name: custom, target: 'm:C'}\n")
        overrides = ["async_rl.sampler.target=mysamp:"]
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    assert "'mysamp:' is not of the form 'module:ClassName'" in str(err.value)
    assert "valid string" not in str(err.value)


def test_an_unquoted_colon_in_yaml_gets_a_quoting_hint(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("async_rl:\n  sampler:\n    name: custom\n    target: mysamp:\n")
    with pytest.raises(ConfigError, match="quote a value that contains"):
        load_config(path)
    path.write_text("grpo:\n  num_prompts_per_step: 8\n   max_num_steps: 2\n")
    with pytest.raises(ConfigError, match="Check the indentation at that line"):
        load_config(path)


def test_an_override_value_that_is_not_yaml_gets_a_quoted_example() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["task.template={wrd} ="])
    assert """task.template='"{wrd} ="'""" in str(err.value)


def test_a_block_swapped_by_an_override_blames_the_override_for_what_it_lacks(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("task: {name: dataset, path: d.jsonl, reward: {name: exact_match}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["task.reward.name=custom"])
    assert str(err.value).startswith("invalid command-line override")
    assert 'task.reward.target: Field required (from the command-line override ' in str(err.value)


# ---------------------------------------- issue 12, case 12: overrides are blamed
def test_an_error_from_an_override_names_the_override_not_the_file(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["grpo.max_num_steps=0"])
    text = str(err.value)
    assert text.startswith("invalid command-line override:")
    assert "grpo.max_num_steps: Input should be greater than or equal to 1" in text
    assert text.endswith('(from the command-line override "grpo.max_num_steps=0")')
    assert str(path) not in text
    path.write_text("grpo: {num_prompts_per_step: 0}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["grpo.max_num_steps=0"])
    text = str(err.value)
    assert text.startswith(f"invalid {path} and command-line override:")
    assert "\ngrpo.num_prompts_per_step: " in text


def test_a_rule_across_blocks_broken_by_overrides_names_them(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\n")
    overrides = ["trainer.strategy=fsdp", "policy.lora.r=8"]
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides)
    assert str(err.value).startswith(
        f"invalid {path} with the command-line overrides {' '.join(overrides)}: config: ")


# ------------------------------------------- issue 28, items 3 and 6: YAML, overrides
@pytest.mark.parametrize(("text", "value"), [
    ("1e-5", 1e-5), ("3e3", 3000.0), ("1.0e5", 1e5), ("-2E-3", -2e-3), (".5e1", 5.0),
    ("+1e0", 1.0), ("0.001", 0.001), ("7", 7), ("1_000", 1000), (".inf", float("inf")),
    ("1e", "1e"), ("e5", "e5"), ("1e-5x", "1e-5x"), ("'1e-5'", "1e-5"), ("2001-12-14", None),
])
def test_yaml_reads_scientific_notation_as_numbers_and_nothing_else(text, value) -> None:
    from asyncrl.config.strict_yaml import load_yaml

    got = load_yaml(f"v: {text}\n", "t")["v"]
    if value is None:  # a timestamp stays YAML 1.1's date
        assert type(got).__name__ == "date"
    else:
        assert got == value and type(got) is type(value)
    # The same value on the command line.
    if value is not None:
        assert parse_override(f"a={text}")[1] == value


def test_yaml_1_1_itself_is_unchanged() -> None:
    import yaml

    assert yaml.safe_load("v: 1e-5") == {"v": "1e-5"}  # PyYAML's own loader: text


def test_overrides_give_one_config_in_any_order(tmp_path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("async_rl:\n  sampler: {name: in_order, max_lookahead_versions: 2}\n")
    items = ["async_rl.sampler.max_staleness_versions=3", "async_rl.sampler.name=windowed",
             "task={name: reverse, max_length: 5}", "task.alphabet=ab",
             "grpo.max_num_steps=9"]
    import itertools

    configs = [load_config(path, list(order)) for order in itertools.permutations(items)]
    assert all(c == configs[0] for c in configs)
    cfg = configs[0]
    assert cfg.async_rl.sampler.max_staleness_versions == 3
    assert cfg.task.name == "reverse" and cfg.task.max_length == 5 and cfg.task.alphabet == "ab"
    # Of two overrides of one key the later one wins, as before.
    assert load_config(None, ["seed=1", "seed=2"]).seed == 2


# ------------------------- a swap keeps the keys both members have (user trial nu4)
def test_a_reward_swap_by_override_keeps_the_pool_keys_and_names_what_it_drops(
        tmp_path, caplog) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("task:\n  name: dataset\n  path: d.jsonl\n  reward: {name: custom, "
                    "target: 'm:f', num_workers: 2, timeout_s: 10, executor: process}\n")
    with caplog.at_level("WARNING", logger="asyncrl.config"):
        cfg = load_config(path, ["task.reward.name=exact_match"])
    reward = cfg.task.reward
    assert reward.name == "exact_match"
    assert (reward.num_workers, reward.timeout_s, reward.executor) == (2, 10, "process")
    [line] = [r.getMessage() for r in caplog.records]
    assert line.startswith("task.reward.name=exact_match drops task.reward.target:"), line
    assert "num_workers" not in line


def test_a_swap_to_the_same_member_or_without_dropped_keys_says_nothing(tmp_path,
                                                                      caplog) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("task: {max_operand: 5}\n")  # arithmetic, the default task, untagged
    with caplog.at_level("WARNING", logger="asyncrl.config"):
        assert load_config(path, ["task.name=arithmetic"]).task.max_operand == 5
        cfg = load_config(path, ["task.name=reverse", "task.num_prompts=3"])
    assert cfg.task.name == "reverse" and cfg.task.num_prompts == 3
    assert [r.getMessage() for r in caplog.records] == [
        "task.name=reverse drops task.max_operand: 'reverse' has no such key (the keys both "
        "have are kept)"]


def test_a_swap_on_a_written_out_config_names_no_key_left_at_its_default(caplog) -> None:
    """Found in review: a resumed run's config.yaml lists every key, so a swap named
    keys nobody set (windowed 'drops' in_order's default max_lookahead_versions)."""
    written = RunConfig().model_dump(mode="json")  # as config.yaml holds a run's config
    set_overrides(written, [("async_rl.sampler.max_lookahead_versions", 3)])
    with caplog.at_level("WARNING", logger="asyncrl.config"):
        set_overrides(RunConfig().model_dump(mode="json"), [("async_rl.sampler.name", "windowed")])
        assert not caplog.records, caplog.text
        set_overrides(written, [("async_rl.sampler.name", "windowed")])
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "async_rl.sampler.name=windowed drops async_rl.sampler.max_lookahead_versions"]


def test_every_discriminated_block_swaps_alike(tmp_path, caplog) -> None:
    # Found from the schema, not a list: simulate's latency model swaps too.
    path = tmp_path / "c.yaml"
    path.write_text("async_rl:\n  sampler: {name: weight_fifo, max_staleness_versions: 3}\n"
                    "simulate:\n  generation_latency_s: {distribution: lognormal, median: 2}\n")
    with caplog.at_level("WARNING", logger="asyncrl.config"):
        cfg = load_config(path, ["async_rl.sampler.name=windowed",
                                 "simulate.generation_latency_s.distribution=constant",
                                 "simulate.generation_latency_s.value=1"])
    assert cfg.async_rl.sampler.max_staleness_versions == 3
    assert cfg.simulate is not None and cfg.simulate.generation_latency_s.distribution == "constant"
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [
        "simulate.generation_latency_s.distribution=constant drops "
        "simulate.generation_latency_s.median"]


def test_a_flow_mapping_without_a_space_after_the_colon_is_explained() -> None:
    # YAML reads {r:4} as the key "r:4" (null): "did you mean 'r'" left the user guessing.
    with pytest.raises(ConfigError) as err:
        load_config(None, ["policy.lora={r:4}"])
    assert ("policy.lora.r:4: unknown key. 'r:4' is one key: YAML needs a space after the "
            "colon in a flow mapping, write {r: 4}.") in str(err.value)
    with pytest.raises(ConfigError, match=r"unknown key\. did you mean 'r'"):
        load_config(None, ["policy.lora={rr: 4}"])  # a misspelling is still one
