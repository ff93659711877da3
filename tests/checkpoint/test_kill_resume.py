"""End to end (real time): SIGKILL a real ``asyncrl train`` after a checkpoint, resume it.

Across both runs every dispatched prompt must end trained, evicted, aborted or
failed exactly once (retries keep their group) — none lost, none trained twice.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.checkpoint import load_latest
from asyncrl.cli import main

pytestmark = pytest.mark.e2e

PER_STEP = 4

# The run is far longer than the test lets it get: it is killed after its first,
# second or third checkpoint, however far it got meanwhile (a loaded machine can
# keep this process from reading the child's lines for a while).
CONFIG = f"""
seed: 3
grpo: {{num_prompts_per_step: {PER_STEP}, num_generations_per_prompt: 4, max_num_steps: 100000}}
async_rl:
  sampler: {{name: ready_first, max_staleness_versions: 1}}
  max_buffered_rollouts: 8
  min_groups_for_streaming_train: 2
  max_inflight_prompts: 8
task: {{name: arithmetic, max_operand: 9}}
policy:
  model: {{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
  generation: {{max_new_tokens: 4}}
  num_threads: 1
checkpoint: {{every_steps: 2, keep_last: 2}}
logging: {{tensorboard: false, plots: false, progress: never}}
"""


def test_sigkill_after_a_checkpoint_then_resume_loses_nothing(tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    run_dir = tmp_path / "run"
    kill_after = random.Random(os.getpid()).randint(1, 3)  # which checkpoint to die after
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "-v", "train", "--config", str(cfg),
         "--run-dir", str(run_dir)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
    )
    seen = 0
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # blocks on the child's output; no sleeping
            if "checkpoint written" in line:
                seen += 1
                if seen == kill_after:
                    os.kill(proc.pid, signal.SIGKILL)
                    break
    finally:  # the (endless) run never outlives the test
        if proc.poll() is None and seen != kill_after:
            proc.kill()
        proc.wait(timeout=120)
    assert seen == kill_after, "the run ended before writing the checkpoint"
    assert proc.returncode == -signal.SIGKILL

    steps = load_latest(run_dir).step + 4  # the resume trains 4 steps more
    assert main(["train", "--resume", str(run_dir), f"grpo.max_num_steps={steps}"]) == 0
    out = capsys.readouterr().out
    assert "resuming" in out

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == steps and summary["ledger"]["balanced"]
    records = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    prompt_ids = [r["prompt_id"] for r in records]
    assert sorted(prompt_ids) == list(range(len(prompt_ids))), "a prompt was lost or repeated"
    states = {r["state"] for r in records}
    assert states <= {"trained", "evicted", "aborted", "failed", "pending"}
    assert sum(r["state"] == "trained" for r in records) == steps * PER_STEP
    recorded = [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert recorded == list(range(steps))
