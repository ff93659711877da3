"""``"module:attr"`` targets (custom samplers, engines, rewards, rollout
functions) are read one way: the form checked in one place, the object found by
:func:`pkgutil.resolve_name` (issue 30, item 3)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import asyncrl
from asyncrl.config.targets import load_target
from asyncrl.errors import ConfigError

SRC = Path(asyncrl.__file__).resolve().parent  # the sources under test


def _load(target: str):
    return load_target(target, field="async_rl.sampler.target", kind="class",
                       example="my_pkg.samplers:MySampler")


def test_the_form_module_colon_attr_is_parsed_in_one_place() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("partition", "split", "rpartition", "rsplit")
                    and node.args and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == ":"):
                found.append(str(path.relative_to(SRC)))
    # Colons that are not the target form: save_by's "DD:HH:MM:SS" and NeMo-RL's
    # "val:accuracy" metric names (config/checkpoint.py, twice), and the key "r:4"
    # YAML reads from {r:4} (config/explain.py).
    not_targets = ["config/checkpoint.py", "config/checkpoint.py", "config/explain.py"]
    assert found == sorted(["config/blocks.py", *not_targets]), (
        "use config.blocks.split_target / load_target")


def test_a_target_resolves_a_nested_attribute() -> None:
    from asyncrl.config.targets import TargetBlock

    assert _load("asyncrl.config.targets:TargetBlock.model_validate") == TargetBlock.model_validate
    assert _load("asyncrl.sampling:BaseSampler").__name__ == "BaseSampler"


def test_a_name_python_cannot_import_is_refused_as_a_malformed_target() -> None:
    with pytest.raises(ConfigError, match=r"'my-pkg\.samplers:MySampler' is not of the form "
                                          r"'module:ClassName'; write e\.g\. target: "):
        _load("my-pkg.samplers:MySampler")


def test_a_missing_attribute_and_a_module_that_fails_to_import_are_told_apart(
        tmp_path, monkeypatch) -> None:
    (tmp_path / "broken_mod.py").write_text("raise AttributeError('a bug in the module')\n")
    (tmp_path / "fine_mod.py").write_text("class Sampler: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="importing module 'broken_mod' raised AttributeError: "
                                          "a bug in the module"):
        _load("broken_mod:Sampler")
    with pytest.raises(ConfigError, match=r"module 'fine_mod' has no attribute 'Sampler2'.*"
                                          r"public class names there: Sampler"):
        _load("fine_mod:Sampler2")
