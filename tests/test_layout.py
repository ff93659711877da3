"""The package layout shows the architecture (issue 30, item 1), and stays so.

* At most :data:`MAX_ROOT_MODULES` modules sit at the package root: the rest
  live in the package of the part of the design they belong to.
* ``asyncrl.config`` is a leaf: loading a config imports no component.
* Packages import only downward, in the order of :data:`LAYERS`, and no
  modules import each other in a circle.
* No module is over :data:`MAX_LINES` lines unless :data:`LONG_MODULES` says why.

Imports are read with :mod:`ast` from every module, including those inside
functions and under ``if TYPE_CHECKING``: a lazy or type-only import ties two
modules together all the same.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "asyncrl"

MAX_ROOT_MODULES = 8
MAX_LINES = 500
#: Modules allowed over MAX_LINES, each with why (none today).
LONG_MODULES: dict[str, str] = {}

#: The packages (and root modules) from the ground up. A package may import its
#: own modules and those of lower layers, never one of its own layer or above.
LAYERS = [
    {"_util", "errors", "record"},
    {"types", "version"},
    {"config", "metrics", "buffer"},
    {"tasks", "sampling"},
    {"policy"},
    {"engines", "trainers"},
    {"checkpoint", "rollouts", "cluster", "controller"},
    {"run", "sim"},
    {"cli"},
    {"__init__", "__main__"},
]
#: What config/ may import besides itself.
CONFIG_MAY_IMPORT = {"errors", "_util"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> set[str]:
    """The asyncrl modules ``path`` imports (``from pkg import mod`` names ``pkg.mod``)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in MODULES else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in MODULES}


def _part(module: str) -> str:
    """The package (or root module) ``asyncrl.x.y`` belongs to: ``x``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_the_package_root_holds_few_modules() -> None:
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root


def test_config_imports_no_component() -> None:
    offenders = {
        f"{module} imports {target}"
        for module, path in MODULES.items() if _part(module) == "config"
        for target in _imports(path)
        if _part(target) not in {"config", *CONFIG_MAY_IMPORT}
    }
    assert not offenders, sorted(offenders)


def test_every_package_has_a_layer() -> None:
    placed = set().union(*LAYERS)
    assert {_part(m) for m in MODULES} <= placed, sorted({_part(m) for m in MODULES} - placed)
    assert sum(map(len, LAYERS)) == len(placed), "a package stands on two layers"


def test_packages_import_only_downward() -> None:
    layer = {part: i for i, parts in enumerate(LAYERS) for part in parts}
    offenders = {
        f"{module} imports {target}"
        for module, path in MODULES.items()
        for target in _imports(path)
        if _part(target) != _part(module) and layer[_part(target)] >= layer[_part(module)]
    }
    assert not offenders, sorted(offenders)


def test_no_import_circles() -> None:
    graph = {module: _imports(path) - {module} for module, path in MODULES.items()}
    try:
        graphlib.TopologicalSorter(graph).prepare()
    except graphlib.CycleError as exc:
        pytest.fail(f"modules import each other in a circle: {' -> '.join(exc.args[1])}")


def test_no_module_is_long_without_a_reason() -> None:
    long = {str(p.relative_to(SRC)): n for p in MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= set(LONG_MODULES), {k: v for k, v in long.items() if k not in LONG_MODULES}
    stale = set(LONG_MODULES) - set(long)
    assert not stale, f"no longer over {MAX_LINES} lines: drop them from LONG_MODULES: {stale}"
