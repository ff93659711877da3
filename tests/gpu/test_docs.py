"""docs/gpu.md: its config snippets validate and the files its commands name exist."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from asyncrl.config import config_from_dict

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "gpu.md").read_text()


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", DOC, flags=re.S)


def test_yaml_snippets_are_valid_config_blocks():
    snippets = blocks("yaml")
    assert snippets
    for snippet in snippets:
        cfg = config_from_dict(yaml.safe_load(snippet), source="docs/gpu.md")
        assert cfg.policy.device == "cuda" and cfg.policy.dtype == "auto"


def test_commands_name_files_that_exist():
    paths = [p for block in blocks("bash")
             for p in re.findall(r"(?:examples|benchmarks)/[\w/.-]+", block)]
    assert "examples/gpu.yaml" in paths and "benchmarks/bench_gpu.py" in paths
    for path in paths:
        assert (ROOT / path).is_file(), path
