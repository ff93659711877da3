"""benchmarks/bench_gpu.py stays runnable: it skips cleanly without CUDA, and its
--cpu-smoke run goes end to end (so a GPU session does not find it broken)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "bench_gpu.py"

pytest.importorskip("transformers")


def run(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(BENCH), *args], capture_output=True, text=True,
                         timeout=600, check=True)
    return out.stdout.strip().splitlines()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip path needs a machine without CUDA")
@pytest.mark.e2e
def test_without_cuda_it_says_why_and_exits_0():
    lines = run()
    assert len(lines) == 1 and lines[0].startswith("SKIP bench_gpu: torch sees no CUDA device")


@pytest.mark.e2e
def test_cpu_smoke_runs_every_sampler_and_reports(tmp_path):
    lines = run("--cpu-smoke", "--models", "small", "--steps", "4", "--warmup", "1",
                "--out", str(tmp_path))
    assert re.fullmatch(r"RESULT gpu_async_speedup \d+\.\d{3}", lines[-1])
    rows = json.loads((tmp_path / "results.json").read_text())
    assert [r["variant"] for r in rows] == ["sync in_order 0", "in_order 1", "ready_first 2"]
    for row in rows:
        assert row["s_per_step"] > 0 and row["gen_tokens_per_s"] > 0
    assert rows[0]["logprob_mismatch"] < 1e-4  # sync in float32 on the CPU: on-policy
    assert rows[0]["async_over_sync"] == 1.0
