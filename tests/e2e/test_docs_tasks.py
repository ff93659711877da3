"""Every code block of docs/tasks.md, run as written, in document order.

From a scratch directory that sees the repository's ``examples/`` (so relative
paths resolve as they do from the repository root) with ``examples/`` on the
import path, as the page says:

* ``json``: a record of the example data file;
* ``yaml``: a valid config block (built into a task when its data file exists);
* ``python``: executed; a ``print(...)  # output`` line must print that
  (tests/docs_snippets.py);
* ``bash``: every ``asyncrl`` command run through the CLI, except the full
  ``examples/dataset.yaml`` run, whose learning ``test_dataset_example_learns_asynchronously_beyond_its_control``
  (tests/e2e/test_workloads.py) checks;
* ``text``: the example error message is the one a real bad file gets.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from asyncrl.cli import build_parser, main
from asyncrl.config import config_from_dict
from asyncrl.errors import ConfigError
from asyncrl.tasks import build_task
from tests.docs_snippets import run_snippet

pytestmark = pytest.mark.e2e
pytest.importorskip("datasets")

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tasks.md"
FULL_RUN = "asyncrl train --config examples/dataset.yaml"


def blocks() -> list[tuple[str, str]]:
    return re.findall(r"```(\w+)\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)


def check_yaml(text: str) -> None:
    tree = yaml.safe_load(text)
    cfg = config_from_dict(tree, source="docs/tasks.md")
    if "task" in tree and Path(cfg.task.path).is_file():
        build_task(cfg.task)  # loads the data, and a custom reward's target


def check_python(text: str) -> None:
    run_snippet(text, {"__name__": "__docs__"}, "docs/tasks.md")


def check_bash(text: str) -> None:
    for line in text.strip().splitlines():
        args = shlex.split(line)
        assert args[0] == "asyncrl", line
        if line.strip() == FULL_RUN:
            build_parser().parse_args(args[1:])
        else:
            assert main([*args[1:], "logging.progress=never"] if args[1] == "train"
                        else args[1:]) == 0, line


def check_text(text: str) -> None:
    if not text.startswith("dataset file 'data.jsonl'"):
        return  # illustrations of shapes, not outputs
    Path("data.jsonl").write_text('{"word": "a", "answer": "1"}\n{"word": "b", "answer": "2"}\n'
                                  '{"word": "c"}\n')
    with pytest.raises(ConfigError) as info:
        build_task({"name": "dataset", "path": "data.jsonl", "template": "{word} ="})
    assert str(info.value) == text.strip()


CHECKS = {"yaml": check_yaml, "python": check_python, "bash": check_bash, "text": check_text}


def test_every_block_of_docs_tasks_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "examples"))
    records = [json.loads(line) for line in
               (ROOT / "examples" / "data" / "number_words.jsonl").read_text().splitlines()]
    seen = set()
    for lang, text in blocks():
        seen.add(lang)
        if lang == "json":
            assert json.loads(text) in records
        else:
            CHECKS[lang](text)
    assert seen == {"json", "yaml", "bash", "python", "text"}
    assert (tmp_path / "runs" / "words" / "final" / "model.safetensors").is_file()


def test_the_custom_reward_shown_is_the_example_file() -> None:
    shown = next(text for lang, text in blocks() if lang == "python" and "def digit_match" in text)
    assert shown.strip() in (ROOT / "examples" / "custom_reward.py").read_text()
