"""Short ``asyncrl train`` runs on vLLM, shared by the end-to-end tests that read them.

Starting vLLM takes most of a run's time here (tens of seconds; its steps take
a tenth of a second each), so a run that several tests can read is made once
per session (the ``vllm_runs`` fixture of tests/e2e/conftest.py) and kept.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from asyncrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")
#: The quickstart on vLLM: heads of 32 (vLLM's CPU kernels take no heads of 16),
#: no files but the ones checked.
VLLM = ["policy.engine=vllm", "policy.model.num_heads=2", "checkpoint.every_steps=0",
        "logging.progress=never", "logging.plots=false", "logging.tensorboard=false"]

#: The shared runs. Both generate up to 6 tokens per completion, so that one can
#: be calibrated on and the other predicted (tests/e2e/test_vllm_train_calibrate.py).
SHARED = {
    # in_order with one step of lookahead (the quickstart's sampler).
    "in_order": ["grpo.max_num_steps=30", "policy.generation.max_new_tokens=6"],
    # windowed with zero staleness and admission that never waits: every sync
    # finds groups generating with the old weights, and aborts them inside vLLM.
    "windowed": ["grpo.max_num_steps=20", "async_rl.sampler.name=windowed",
                 "async_rl.sampler.max_staleness_versions=0",
                 "async_rl.max_buffered_rollouts=24", "async_rl.max_inflight_prompts=24",
                 "async_rl.min_groups_for_streaming_train=4",
                 "policy.generation.max_new_tokens=6"],
}


@dataclasses.dataclass
class TrainRun:
    run_dir: Path
    code: int
    summary: dict[str, Any]
    records: list[dict[str, Any]]


def train(run_dir: Path, *overrides: str, config: str = QUICKSTART) -> TrainRun:
    code = main(["train", "--config", config, "--run-dir", str(run_dir), *VLLM, *overrides])
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return TrainRun(run_dir, code, summary, records)


class SharedRuns:
    """The runs of :data:`SHARED`, each made the first time a test asks for it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._runs: dict[str, TrainRun] = {}

    def get(self, name: str) -> TrainRun:
        if name not in self._runs:
            self._runs[name] = train(self.base / name, *SHARED[name])
        return self._runs[name]
