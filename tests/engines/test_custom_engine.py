"""``policy.engine: custom``: the engine of docs/engines.md trains the quickstart,
and a bad target is one line naming the fix (the Ray run: tests/cluster/test_ray_backend.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.engines.factory import check_engine_target
from asyncrl.errors import ConfigError
from asyncrl.run.train import train

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "custom_engine.py"


def custom_quickstart(*overrides: str):
    """examples/custom_engine.yaml, a few steps long."""
    return load_config(REPO / "examples" / "custom_engine.yaml",
                       ["grpo.max_num_steps=2", "logging.progress=never", *overrides])


def test_the_docs_show_the_whole_engine_in_under_80_lines():
    source = EXAMPLE.read_text()
    assert len(source.splitlines()) < 80
    assert source in (REPO / "docs" / "engines.md").read_text()


@pytest.mark.e2e
def test_the_custom_engine_of_the_docs_trains_the_quickstart(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    summary = train(custom_quickstart(), tmp_path / "run")
    ledger = summary["ledger"]
    assert summary["steps"] == 2 and ledger["balanced"] and ledger["failed"] == 0, summary
    assert ledger["trained"] == 2 * 8


class NoUpdates:
    def __init__(self, ctx) -> None: ...

    async def generate(self, request): ...

    def update_weights(self, weights, version): ...  # not async


class SyncGenerate:
    def __init__(self, ctx) -> None: ...

    def generate(self, request): ...  # there, but not async

    async def update_weights(self, weights, version): ...

    async def close(self): ...


@pytest.mark.parametrize(("target", "keys", "says"), [
    ("no_such_module_xyz:Engine", {}, "cannot be imported.*installed or on PYTHONPATH"),
    ("tests.engines.test_custom_engine:Missing", {}, "has no attribute 'Missing'"),
    ("tests.engines.test_custom_engine:NoUpdates", {},
     r": close is missing; update_weights is not 'async def'; define each of generate, "
     r"update_weights, close as an 'async def' method"),
    ("tests.engines.test_custom_engine:SyncGenerate", {},
     r"RolloutEngine: generate is not 'async def'; define each of"),
    ("custom_engine:PlainTorchEngine", {"beams": 2},
     r"cannot be called as PlainTorchEngine\(ctx, \*\*\{'beams': 2\}\).*define __init__"),
])
def test_a_bad_target_is_one_line_naming_the_fix(target, keys, says, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    cfg = custom_quickstart(f"policy.custom_engine.target={target}",
                            *(f"policy.custom_engine.{k}={v}" for k, v in keys.items()))
    with pytest.raises(ConfigError, match=f"policy.custom_engine.target {target!r}.*{says}") \
            as info:
        check_engine_target(cfg.policy.custom_engine)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("overrides", "says"), [
    (["policy.custom_engine=null"], "engine: custom needs policy.custom_engine"),
    (["policy.engine=local"], "set policy.engine: custom to use it"),
    (["policy.custom_engine.target=nocolon"], "not of the form 'module:ClassName'"),
])
def test_the_config_refuses_a_half_custom_engine(overrides, says):
    with pytest.raises(ConfigError, match=says):
        custom_quickstart(*overrides)
