"""``custom`` samplers loaded by ``module:ClassName``, and config parsing errors."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncrl.buffer import RolloutBuffer
from asyncrl.config import load_config
from asyncrl.errors import SamplerConfigError
from asyncrl.sampling import (
    CustomSamplerConfig,
    InOrderSampler,
    InOrderSamplerConfig,
    PromptGroupSampler,
    ReadyFirstSamplerConfig,
    WeightFifoSamplerConfig,
    WindowedSampler,
    WindowedSamplerConfig,
    create_sampler,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HERE = Path(__file__).resolve().parent


@pytest.fixture
def importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make ``custom_sampler`` (examples/) and ``bad_samplers`` (here) importable."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(HERE))


# ---------------------------------------------------------------- good paths
@pytest.mark.usefixtures("importable")
def test_custom_target_with_extra_kwargs_from_a_dict() -> None:
    buf = RolloutBuffer(8)
    sampler = create_sampler(
        buf,
        {
            "name": "custom",
            "target": "custom_sampler:FreshestOnlySampler",
            "max_staleness_versions": 2,
        },
    )
    assert type(sampler).__name__ == "FreshestOnlySampler"
    assert isinstance(sampler, PromptGroupSampler)
    assert sampler.buffer is buf and sampler.window == 2
    assert not sampler.is_on_policy
    assert sampler.required_buffer_capacity(4) == 12


@pytest.mark.usefixtures("importable")
def test_custom_target_from_a_config_model() -> None:
    cfg = CustomSamplerConfig(target="custom_sampler:FreshestOnlySampler", max_staleness_versions=0)
    assert cfg.kwargs == {"max_staleness_versions": 0}
    sampler = create_sampler(RolloutBuffer(4), cfg)
    assert type(sampler).__name__ == "FreshestOnlySampler"
    assert sampler.is_on_policy


@pytest.mark.usefixtures("importable")
async def test_the_example_sampler_trains_the_freshest_version_first() -> None:
    buf = RolloutBuffer(16)
    sampler = create_sampler(
        buf, {"name": "custom", "target": "custom_sampler:FreshestOnlySampler"}
    )
    for weight in (0, 1, 2, 2):
        gid = f"w{weight}-{len(buf)}"
        await buf.reserve(gid, start_weight=weight)
        buf.commit(gid, None)
    await buf.reserve("late", start_weight=3)  # in flight: never selected, never evicted

    # Default window s = 1: at v = 2 the window is [1, 2], so weight 0 goes.
    assert await sampler.evict(current_train_weight=2) == 1
    chosen = await sampler.select(current_train_weight=2, min_prompt_groups=1, max_prompt_groups=8)
    assert chosen is not None and [s.group_id for s in chosen] == ["w2-2", "w2-3"]
    # At v = 3 the window is [2, 3]: the group of weight 1 can never be selected again.
    assert await sampler.evict(current_train_weight=3) == 1
    assert (
        await sampler.select(current_train_weight=3, min_prompt_groups=1, max_prompt_groups=8)
        is None
    )
    assert [s.group_id for s in buf.slots()] == ["late"]
    assert sampler.should_abort_inflight(start_weight_version=1, current_train_weight=3)
    assert not sampler.should_abort_inflight(start_weight_version=2, current_train_weight=3)


@pytest.mark.usefixtures("importable")
def test_the_example_yaml_builds_the_custom_sampler() -> None:
    cfg = load_config(EXAMPLES / "custom_sampler.yaml")
    assert isinstance(cfg.async_rl.sampler, CustomSamplerConfig)
    sampler = create_sampler(
        RolloutBuffer(cfg.async_rl.max_buffered_rollouts), cfg.async_rl.sampler
    )
    assert type(sampler).__name__ == "FreshestOnlySampler"
    required = sampler.required_buffer_capacity(cfg.grpo.num_prompts_per_step)
    # The example must pass the controller's setup check.
    assert required is not None and cfg.async_rl.max_buffered_rollouts >= required
    assert cfg.async_rl.max_buffered_rollouts >= cfg.async_rl.min_groups_for_streaming_train


@pytest.mark.parametrize(
    ("model", "as_dict", "cls", "window"),
    [
        (
            InOrderSamplerConfig(max_lookahead_versions=2),
            {"name": "in_order", "max_lookahead_versions": 2},
            InOrderSampler,
            2,
        ),
        (WeightFifoSamplerConfig(), {"name": "weight_fifo"}, None, 1),
        (
            WindowedSamplerConfig(max_staleness_versions=3, sample_freshest_first=True),
            {"name": "windowed", "max_staleness_versions": 3, "sample_freshest_first": True},
            WindowedSampler,
            3,
        ),
        (
            ReadyFirstSamplerConfig(max_staleness_versions=0),
            {"name": "ready_first", "max_staleness_versions": 0},
            None,
            0,
        ),
    ],
    ids=["in_order", "weight_fifo", "windowed", "ready_first"],
)
def test_create_sampler_accepts_a_model_or_a_dict(
    model: object, as_dict: dict, cls: type | None, window: int
) -> None:
    from_model = create_sampler(RolloutBuffer(4), model)
    from_dict = create_sampler(RolloutBuffer(4), as_dict)
    assert type(from_model) is type(from_dict)
    assert from_model.window == from_dict.window == window  # type: ignore[attr-defined]
    if cls is not None:
        assert isinstance(from_model, cls)
    if isinstance(from_model, WindowedSampler):
        assert from_model.sample_freshest_first and from_dict.sample_freshest_first  # type: ignore[attr-defined]


# ---------------------------------------------------------- bad custom targets
BAD_TARGETS = [
    (
        "custom_sampler.FreshestOnlySampler",
        {},
        ["is not of the form 'module:ClassName'", "my_pkg.samplers:MySampler"],
    ),
    ("custom_sampler:", {}, ["is not of the form 'module:ClassName'"]),
    (":FreshestOnlySampler", {}, ["is not of the form 'module:ClassName'"]),
    ("a:b:c", {}, ["is not of the form 'module:ClassName'"]),
    (
        "asyncrl_no_such_module:Sampler",
        {},
        ["module 'asyncrl_no_such_module' cannot be imported", "installed or on PYTHONPATH"],
    ),
    (
        "custom_sampler:NoSuchSampler",
        {},
        ["has no attribute 'NoSuchSampler'", "check the class name", "FreshestOnlySampler"],
    ),
    ("bad_samplers:NOT_CALLABLE", {}, ["is not a class or callable"]),
    (
        "bad_samplers:NoArgsSampler",
        {},
        [
            "does not take the RolloutBuffer as its first positional argument",
            "__init__(self, buffer, ...)",
        ],
    ),
    (
        "bad_samplers:KeywordOnlySampler",
        {},
        [
            "does not take the RolloutBuffer as its first positional argument",
            "subclass asyncrl.sampling.BaseSampler",
        ],
    ),
    (
        "bad_samplers:BufferSecondSampler",
        {},
        [
            "cannot be called as Sampler(buffer, **{})",
            "take the RolloutBuffer as the first argument",
        ],
    ),
    (
        "bad_samplers:StrictSampler",
        {"colour": "red", "window": 2},
        ["does not accept the config keys ['colour']", "remove them from async_rl.sampler"],
    ),
    (
        "bad_samplers:IncompleteSampler",
        {},
        [
            "does not satisfy PromptGroupSampler",
            "missing admit, evict, should_abort_inflight, is_on_policy, required_buffer_capacity, set_dispatch_index, state_dict, load_state_dict.",
            "subclass asyncrl.sampling.BaseSampler",
        ],
    ),
    (
        "bad_samplers:SyncAdmitSampler",
        {},
        # admit is there, only synchronous: not "missing" (engines say it alike).
        ["does not satisfy PromptGroupSampler: admit is not 'async def'. Implement them "
         "(admit, select, evict as 'async def' methods)"],
    ),
    (
        "bad_samplers:SyncAdmitIncompleteSampler",
        {},
        ["does not satisfy PromptGroupSampler: missing select, evict, should_abort_inflight, "
         "is_on_policy, required_buffer_capacity, set_dispatch_index, state_dict, "
         "load_state_dict; admit is not 'async def'. Implement them"],
    ),
    (  # issue 12, case 9: an __init__ that raises is an error naming the cause
        "bad_samplers:RaisingSampler",
        {"window": 3},
        ["could not be constructed", "raised RuntimeError: window 3 is not supported"],
    ),
    (  # issue 12, case 9: a BaseSampler subclass without select, found before step 0
        "bad_samplers:NoSelectSampler",
        {},
        ["does not satisfy PromptGroupSampler", "missing select (BaseSampler has none"],
    ),
]


@pytest.mark.usefixtures("importable")
@pytest.mark.parametrize(
    ("target", "extra", "fragments"), BAD_TARGETS, ids=[t for t, _, _ in BAD_TARGETS]
)
def test_bad_custom_target_names_the_target_and_the_fix(
    target: str, extra: dict, fragments: list[str]
) -> None:
    with pytest.raises(SamplerConfigError) as info:
        create_sampler(RolloutBuffer(4), {"name": "custom", "target": target, **extra})
    message = str(info.value)
    # The target's form is checked with the config (path, colon), the rest on loading.
    assert re.search(rf"async_rl\.sampler\.target:? {re.escape(repr(target))}", message), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert isinstance(info.value, ValueError)


def test_module_with_a_missing_dependency_is_told_apart_from_a_missing_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "needs_dep_sampler.py").write_text("import asyncrl_missing_dependency\n")
    (tmp_path / "broken_sampler.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    with pytest.raises(SamplerConfigError) as info:
        create_sampler(RolloutBuffer(4), {"name": "custom", "target": "needs_dep_sampler:S"})
    assert "module 'needs_dep_sampler' was found but importing it failed" in str(info.value)
    assert "install 'asyncrl_missing_dependency'" in str(info.value)

    with pytest.raises(SamplerConfigError) as info:
        create_sampler(RolloutBuffer(4), {"name": "custom", "target": "broken_sampler:S"})
    assert "raised RuntimeError: boom at import" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)


def test_custom_without_target_is_rejected() -> None:
    with pytest.raises(SamplerConfigError, match=r"async_rl\.sampler\.target: Field required"):
        create_sampler(RolloutBuffer(4), {"name": "custom"})


# ------------------------------------------------------ built-in config errors
@pytest.mark.parametrize(
    ("cfg", "key", "suggestion"),
    [
        (
            {"name": "in_order", "max_staleness_versions": 1},
            "max_staleness_versions",
            "max_lookahead_versions",
        ),
        ({"name": "weight_fifo", "sample_freshest_first": True}, "sample_freshest_first", None),
        ({"name": "windowed", "sample_freshest": True}, "sample_freshest", "sample_freshest_first"),
        ({"name": "ready_first", "max_lookahead_versions": 2}, "max_lookahead_versions", None),
        ({"name": "windowed", "colour": "red"}, "colour", None),
    ],
)
def test_unknown_key_on_a_builtin_is_rejected_with_the_key_named(
    cfg: dict, key: str, suggestion: str | None
) -> None:
    with pytest.raises(SamplerConfigError) as info:
        create_sampler(RolloutBuffer(4), cfg)
    message = str(info.value)
    assert f"async_rl.sampler.{key}: unknown key" in message
    assert "valid keys here:" in message
    if suggestion is not None:
        assert f"did you mean '{suggestion}'?" in message


def test_unknown_policy_name_lists_the_valid_ones() -> None:
    with pytest.raises(SamplerConfigError) as info:
        create_sampler(RolloutBuffer(4), {"name": "fifo"})
    for name in ("in_order", "weight_fifo", "windowed", "ready_first", "custom"):
        assert name in str(info.value)


@pytest.mark.parametrize("cfg", [None, "in_order", {"max_lookahead_versions": 1}])
def test_config_without_a_name_is_rejected(cfg: object) -> None:
    with pytest.raises(SamplerConfigError, match="expected a mapping with a 'name' key"):
        create_sampler(RolloutBuffer(4), cfg)


def test_negative_window_is_rejected_with_the_field_named() -> None:
    with pytest.raises(SamplerConfigError, match=r"async_rl\.sampler\.max_lookahead_versions"):
        create_sampler(RolloutBuffer(4), {"name": "in_order", "max_lookahead_versions": -1})
