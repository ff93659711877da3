"""Issue 18, case 5: the README's vLLM quickstart prints, at default verbosity,
at most 30 lines more than the local quickstart (it used to print a dozen
start-up warnings, then a progress bar and a warning on every weight sync).
vLLM's own output is kept in ``RUN_DIR/vllm.log``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
STEPS = "grpo.max_num_steps=4"  # few steps: before the fix, 4 more lines per sync


def readme_vllm_command() -> list[str]:
    """The README's vLLM quickstart line, as ``asyncrl`` arguments."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if "asyncrl train" in line and "policy.engine=vllm" in line:
            return shlex.split(line.strip())[1:]
    raise AssertionError("README.md has no vLLM quickstart line")


def output_lines(args: list[str], run_dir: Path) -> list[str]:
    """Every line ``asyncrl`` printed (stdout and stderr; a carriage return
    starts a line too, as a progress bar redraws it)."""
    command, *rest = args
    proc = subprocess.run([sys.executable, "-m", "asyncrl", command, "--run-dir", str(run_dir),
                           *rest, STEPS], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [x for x in re.split(r"[\r\n]+", proc.stdout + proc.stderr) if x.strip()]


def test_the_vllm_quickstart_prints_at_most_30_lines_more_than_the_local_one(
        tmp_path: Path) -> None:
    vllm_args = readme_vllm_command()
    local_args = [a for a in vllm_args if not a.startswith(("policy.engine=",
                                                            "policy.model.num_heads="))]
    assert vllm_args[0] == "train" and local_args != vllm_args
    local = output_lines(local_args, tmp_path / "local")
    vllm = output_lines(vllm_args, tmp_path / "vllm")
    assert len(vllm) - len(local) <= 30, "\n".join(vllm)
    assert any("its own output goes to" in line and "vllm.log" in line for line in vllm)
    log = (tmp_path / "vllm" / "vllm.log").read_text()
    assert "WARNING" in log  # vLLM's own lines, kept in the log file
