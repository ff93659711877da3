"""``examples/minimal_async_grpo.py`` runs as written (here for three steps, in
this process: the imports are the slow part of a fresh interpreter). Its time
budget stays out of reach: how many steps fit in seconds is the machine's."""

from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_async_grpo.py"


@pytest.mark.e2e
def test_the_minimal_example_trains_asynchronously_and_reports(monkeypatch, capsys):
    assert len(EXAMPLE.read_text().splitlines()) < 150
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--steps", "3", "--seconds", "86400"])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    lines = capsys.readouterr().out.strip().splitlines()
    steps = [line for line in lines if line.startswith("step ")]
    assert len(steps) == 3, lines
    stale = [int(re.search(r"max (\d+)", line).group(1)) for line in steps]
    # One version of lookahead: generation ran ahead of training, never further.
    assert max(stale) == 1 and min(stale) >= 0
    assert all(re.search(r"reward \d\.\d{3}", line) for line in steps)
    summary = lines[-1]
    assert summary.startswith(f"trained {len(steps)} steps") and "balanced True" in summary
