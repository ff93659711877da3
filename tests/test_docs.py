"""Every snippet in README.md and docs/*.md runs as written.

* ``python`` blocks run in order, in a scratch directory that sees the repo's
  ``examples/``, as plain scripts: no top-level ``await`` (a reader pastes one
  into a file and runs ``python``). Each runs on its own, in a fresh namespace,
  as a reader who copies only that block runs it; a block that goes on from the
  ones before it says so on its first line (``# Continues ...``) and runs with
  what they defined. A ``print(...)  # output`` line must print that output
  (``...`` for any text; tests/docs_snippets.py).
* ``yaml`` blocks parse; a block that is a run config (its keys are config
  blocks) is validated like a config file.
* ``bash`` blocks: every ``asyncrl ...`` line parses with the real CLI parser,
  names files that exist, and ``asyncrl validate`` lines run for real.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from asyncrl.cli import build_parser, main
from asyncrl.config import RunConfig, config_from_dict
from asyncrl.config.strict_yaml import load_yaml
from tests.docs_snippets import run_snippet

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w+)[^\n]*\n(.*?)^```", re.S | re.M)


def blocks(doc: Path, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(doc.read_text()) if kind == lang]


#: Pages with a test of their own that runs every block in the page's own setting.
OWN_TEST = {"tasks.md": "tests/e2e/test_docs_tasks.py"}


def docs_with(lang: str) -> list[Path]:
    return [d for d in DOCS if blocks(d, lang) and d.name not in OWN_TEST]


def _id(doc: Path) -> str:
    return str(doc.relative_to(REPO))


@pytest.mark.e2e
@pytest.mark.parametrize("doc", docs_with("python"), ids=_id)
def test_python_snippets_run(doc: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "examples").symlink_to(REPO / "examples")
    page: dict = {}  # what the blocks so far defined, for a block that continues them
    for i, body in enumerate(blocks(doc, "python")):
        namespace = page if continues(body) else {"__name__": f"docs_{doc.stem}_{i + 1}"}
        run_snippet(body, namespace, f"{_id(doc)} python block {i + 1}")
        page.update(namespace)


def continues(body: str) -> bool:
    """The block says it goes on from the ones before it (its first line)."""
    return body.lstrip().lower().startswith("# continues")


@pytest.mark.parametrize("doc", docs_with("yaml"), ids=_id)
def test_yaml_snippets_parse_and_configs_validate(doc: Path) -> None:
    for body in blocks(doc, "yaml"):
        tree = load_yaml(body, f"a yaml block of {_id(doc)}")  # as asyncrl reads a file
        # (loss_fn: NeMo-RL's block, which the loader maps onto asyncrl's keys)
        if isinstance(tree, dict) and tree and set(tree) <= {*RunConfig.model_fields, "loss_fn"}:
            config_from_dict(tree, source=f"a yaml block of {_id(doc)}")


def _cli_lines(doc: Path) -> list[list[str]]:
    out = []
    for body in blocks(doc, "bash"):
        for line in body.splitlines():
            line = line.split("#", 1)[0].strip()
            if line.startswith("asyncrl "):
                out.append(shlex.split(line)[1:])
    return out


@pytest.mark.parametrize("doc", [d for d in DOCS if _cli_lines(d)], ids=_id)
def test_cli_lines_parse_and_name_existing_files(doc: Path, monkeypatch) -> None:
    monkeypatch.chdir(REPO)
    parser = build_parser()
    for argv in _cli_lines(doc):
        args = parser.parse_args(argv)
        config = getattr(args, "config", None)
        if config is not None:
            assert (REPO / config).is_file(), f"{_id(doc)}: {' '.join(argv)}: no file {config}"
        if args.command == "validate":
            assert main(argv) == 0, f"{_id(doc)}: asyncrl {' '.join(argv)} failed"


def test_the_command_line_synopsis_of_design_md_is_the_parsers() -> None:
    """docs/design.md, "The command line": each command's lines name every option
    and argument its parser has (validate's overrides, --json and --no-memory were
    missing), and no option it does not have."""
    import argparse

    section = (REPO / "docs" / "design.md").read_text().split("## The command line", 1)[1]
    synopsis = section.split("```", 2)[1]
    by_command: dict[str, str] = {}
    command = ""
    for line in synopsis.splitlines():
        if line.startswith("asyncrl "):
            command = line.split()[1]
        by_command[command] = by_command.get(command, "") + " " + line
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(by_command) - {""} == set(sub.choices)
    for name, parser in sub.choices.items():
        text = by_command[name]
        options = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
        options.discard("--help")
        written = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", text))
        assert written == options, f"asyncrl {name}: the synopsis has {sorted(written)}"
        for action in parser._actions:
            if action.option_strings or action.nargs == "?":
                continue
            names = action.choices or [action.metavar or action.dest.upper()]
            assert all(str(n) in text for n in names), f"asyncrl {name}: {names} not shown"


def test_the_nemo_rl_table_of_training_md_is_the_codes() -> None:
    """docs/training.md shows asyncrl.config.nemo_rl_keys.NEMO_RL_KEYS, the table the config
    blocks read their refusals from: the two never disagree."""
    from asyncrl.config.nemo_rl_keys import table_rows

    lines = (REPO / "docs" / "training.md").read_text().splitlines()
    start = lines.index("| NeMo-RL key | in asyncrl |") + 2  # past the header and |---|
    shown = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        keys, meaning = (cell.strip() for cell in line.strip("|").split(" | "))
        shown.append((keys, meaning))
    assert shown == table_rows()


def test_the_nemo_rl_recipe_table_of_recipes_md_is_the_codes() -> None:
    """docs/recipes.md shows asyncrl.config.nemo_rl_keys.NEMO_RL_RECIPE_KEYS, the
    table the loader maps NeMo-RL's grpo and loss_fn keys with."""
    from asyncrl.config.nemo_rl_keys import recipe_table_rows

    lines = (REPO / "docs" / "recipes.md").read_text().splitlines()
    start = lines.index("| NeMo-RL recipe key | in asyncrl |") + 2
    shown = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        key, meaning = (cell.strip() for cell in line.strip("|").split(" | "))
        shown.append((key, meaning))
    assert shown == recipe_table_rows()
