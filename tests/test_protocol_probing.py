"""Optional members are explicit protocols and engine kinds are specs (issue 30,
item 3): the source probes no task or trainer with ``getattr`` and tests no
engine name where a spec says what the kind does."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import asyncrl

SRC = Path(asyncrl.__file__).resolve().parent  # the sources under test


def _modules() -> list[tuple[str, ast.AST]]:
    return [(str(p.relative_to(SRC)), ast.parse(p.read_text(), str(p)))
            for p in sorted(SRC.rglob("*.py"))]


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def test_no_task_or_trainer_is_probed_with_getattr() -> None:
    found = [f"{path}:{node.lineno}" for path, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _name(node.func) in ("getattr", "hasattr")
             and node.args and _name(node.args[0]).lower().endswith(("task", "trainer"))]
    assert found == [], "read a TaskCapabilities / TrainerCapabilities flag instead"


def test_no_concrete_task_is_tested_with_isinstance() -> None:
    found = [f"{path}:{node.lineno}" for path, tree in _modules() for node in ast.walk(tree)
             if isinstance(node, ast.Call) and _name(node.func) == "isinstance"
             and len(node.args) == 2 and _name(node.args[1]).endswith("Task")]
    assert found == [], "ask the task's capabilities (asyncrl.tasks.capabilities)"


def test_no_engine_name_is_tested_outside_the_config() -> None:
    """What an engine kind does is its EngineSpec's; only the config, a leaf that
    imports no component, checks combinations of names itself."""
    found = []
    for path, tree in _modules():
        if path.startswith("config/"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and _name(node.left) == "engine" and any(
                    (isinstance(c, ast.Constant) and isinstance(c.value, str))
                    or isinstance(c, ast.Tuple) for c in node.comparators):
                found.append(f"{path}:{node.lineno}")
    assert found == [], "ask engine_spec(policy) (asyncrl.engines.specs)"


def test_every_engine_name_has_a_spec_and_a_builder() -> None:
    from asyncrl.config.policy import EngineName
    from asyncrl.engines.factory import _BUILDERS
    from asyncrl.engines.specs import ENGINE_SPECS

    names = set(get_args(EngineName))
    assert set(ENGINE_SPECS) == names and set(_BUILDERS) == names
    assert all(spec.name == name for name, spec in ENGINE_SPECS.items())


def test_a_spec_names_its_engine_class() -> None:
    from asyncrl.config import PolicyConfig
    from asyncrl.engines.factory import engine_class
    from asyncrl.engines.local.engine import LocalEngine
    from asyncrl.engines.specs import ENGINE_SPECS

    assert engine_class(PolicyConfig()) is LocalEngine
    # The vLLM engines' classes import without vLLM (they import it when built).
    for name in ("vllm", "vllm_server"):
        cls = ENGINE_SPECS[name].engine_class()
        assert f"{cls.__module__}:{cls.__qualname__}" == ENGINE_SPECS[name].target
