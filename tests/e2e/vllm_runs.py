"""Short ``asyncrl train`` runs on vLLM, shared by the end-to-end tests that read them.

Starting vLLM takes most of a run's time here (tens of seconds of both cores;
its steps take a tenth of a second each), so a run that several tests can read
is made once per session (the ``vllm_runs`` fixture of tests/e2e/conftest.py)
and kept.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from asyncrl.cli import main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "examples" / "quickstart.yaml")
#: The quickstart on vLLM: heads of 32 (vLLM's CPU kernels take no heads of 16),
#: no files but the ones checked.
VLLM = ["policy.engine=vllm", "policy.model.num_heads=2", "checkpoint.every_steps=0",
        "logging.progress=never", "logging.plots=false", "logging.tensorboard=false"]

#: What the shared runs add to their commands. Both generate up to 6 tokens per
#: completion, so that one can be calibrated on and the other predicted
#: (benchmarks/bench_calibrate.py makes them too).
SHARED = {
    # The README's vLLM quickstart as a user types it (in_order, one step of
    # lookahead), run as its own process: its output is read too. No plots or
    # TensorBoard events, as in the runs of VLLM (and the calibration's source).
    "in_order": ["grpo.max_num_steps=30", "policy.generation.max_new_tokens=6",
                 "logging.plots=false", "logging.tensorboard=false"],
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
    #: Every line the run printed (stdout and stderr), for a run made as a process.
    output: list[str] = dataclasses.field(default_factory=list)


def read_run(run_dir: Path, code: int, output: list[str] | None = None) -> TrainRun:
    summary = json.loads((run_dir / "summary.json").read_text())
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return TrainRun(run_dir, code, summary, records, output or [])


def train(run_dir: Path, *overrides: str, config: str = QUICKSTART) -> TrainRun:
    code = main(["train", "--config", config, "--run-dir", str(run_dir), *VLLM, *overrides])
    return read_run(run_dir, code)


def readme_vllm_command() -> list[str]:
    """The README's vLLM quickstart line, as ``asyncrl`` arguments."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if "asyncrl train" in line and "policy.engine=vllm" in line:
            return shlex.split(line.strip())[1:]
    raise AssertionError("README.md has no vLLM quickstart line")


def cli_train(run_dir: Path, args: list[str]) -> TrainRun:
    """``asyncrl <args> --run-dir run_dir`` as its own process, from the repository
    root; its output lines (a carriage return starts a line too, as a progress
    bar redraws it)."""
    command, *rest = args
    proc = subprocess.run([sys.executable, "-m", "asyncrl", command, "--run-dir", str(run_dir),
                           *rest], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    output = [x for x in re.split(r"[\r\n]+", proc.stdout + proc.stderr) if x.strip()]
    return read_run(run_dir, proc.returncode, output)


class SharedRuns:
    """The runs of :data:`SHARED`, each made the first time a test asks for it."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self._runs: dict[str, TrainRun | BaseException] = {}

    def get(self, name: str) -> TrainRun:
        if name not in self._runs:
            run_dir = self.base / name
            try:
                if name == "in_order":
                    run = cli_train(run_dir, [*readme_vllm_command(), *SHARED[name]])
                else:
                    run = train(run_dir, *SHARED[name])
            except Exception as exc:  # the next reader gets the same failure, not a rerun
                self._runs[name] = exc
                raise
            self._runs[name] = run
        run = self._runs[name]
        if isinstance(run, BaseException):
            raise AssertionError(f"the shared {name!r} run failed (see the first test "
                                 "that read it)") from run
        return run
