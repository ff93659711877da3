"""Whole runs with the sharded trainer (gloo, world size 2): deterministic
resume across world sizes, and a rank killed mid-run, then resumed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from asyncrl.checkpoint import prepare_resume
from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.runner import train

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
FSDP2 = ["trainer.strategy=fsdp", "trainer.world_size=2"]
SINGLE = ["trainer.strategy=single", "trainer.world_size=1"]
QUIET = ["logging.progress=never", "logging.tensorboard=false", "logging.plots=false"]
#: A small, fast run: 4 groups of 4 completions per step, a one-layer model.
SMALL = ["grpo.num_prompts_per_step=4", "grpo.num_generations_per_prompt=4",
         "async_rl.max_buffered_rollouts=8", "async_rl.min_groups_for_streaming_train=2",
         "async_rl.max_inflight_prompts=8", "policy.model.num_layers=1",
         "policy.model.hidden_size=32", "policy.model.num_heads=2",
         "policy.model.intermediate_size=64", "policy.generation.max_new_tokens=3"]


def final_weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "final" / "model.safetensors")


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert sorted(a) == sorted(b)
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.mark.parametrize(("before", "after"), [(FSDP2, ["trainer.world_size=1"]),
                                                (SINGLE, FSDP2)], ids=["2to1", "1to2"])
def test_deterministic_resume_at_another_world_size_gives_the_same_weights(
        before: list[str], after: list[str], tmp_path: Path) -> None:
    """Checkpointed at one world size, resumed at another: the final weights are
    those of the uninterrupted run (2 -> 1 reshards the sharded checkpoint onto one
    rank; 1 -> 2 shards a single-process checkpoint)."""
    steps = 4
    cfg = load_config(ROOT / "examples" / "quickstart.yaml", [
        "deterministic=true", f"grpo.max_num_steps={steps}", "checkpoint.every_steps=2",
        *QUIET, *SMALL, *before])
    whole = tmp_path / "whole"
    train(cfg, whole)
    # The same run killed after its step-2 checkpoint: what came after is gone.
    killed = tmp_path / "killed"
    shutil.copytree(whole, killed)
    shutil.rmtree(killed / "checkpoints" / f"step-{steps:06d}")
    shutil.rmtree(killed / "final")
    resumed_cfg, ckpt = prepare_resume(killed, after)
    assert ckpt.step == 2 and resumed_cfg.trainer.world_size != cfg.trainer.world_size
    train(resumed_cfg, killed, resume=ckpt)
    assert max_abs_diff(final_weights(whole), final_weights(killed)) <= 1e-5


CONFIG = """
seed: 3
grpo: {num_prompts_per_step: 4, num_generations_per_prompt: 4, max_num_steps: 8}
async_rl:
  sampler: {name: in_order, max_lookahead_versions: 1}
  max_buffered_rollouts: 8
  min_groups_for_streaming_train: 2
  max_inflight_prompts: 8
task: {name: arithmetic, max_operand: 9}
policy:
  model: {hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}
  generation: {max_new_tokens: 4}
trainer: {strategy: fsdp, world_size: 2}
checkpoint: {every_steps: 2, keep_last: 2}
logging: {tensorboard: false, plots: false, progress: never}
"""


def test_a_rank_killed_mid_run_ends_it_naming_the_rank_and_resume_completes(
        tmp_path: Path, capsys) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(CONFIG)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "-v", "train", "--config", str(cfg),
         "--run-dir", str(run_dir)],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    ranks: list[int] = []
    family: set[int] = set()
    victim = None
    lines = []
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # blocks on the child's output; no sleeping
            lines.append(line)
            if "sharded trainer started" in line:
                ranks = [int(p) for p in line.split("pids ")[1].split(")")[0].split(", ")]
                family = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
            if "checkpoint written" in line and victim is None:
                victim = ranks[1]
                os.kill(victim, signal.SIGKILL)
    finally:
        proc.wait(timeout=120)
    err = "".join(lines)
    assert victim is not None, err
    assert proc.returncode == 2, err
    assert f"rank 1 (pid {victim}) died during" in err and "killed by SIGKILL" in err
    assert f"asyncrl train --resume {run_dir}" in err
    assert set(ranks) <= family
    alive = [p for p in family if psutil.pid_exists(p)
             and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left behind: {alive}"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["ledger"]["balanced"]

    assert main(["train", "--resume", str(run_dir)]) == 0
    assert "resuming" in capsys.readouterr().out
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 8 and summary["ledger"]["balanced"]
    records = [json.loads(x) for x in (run_dir / "ledger.jsonl").read_text().splitlines()]
    prompt_ids = [r["prompt_id"] for r in records]
    assert sorted(prompt_ids) == list(range(len(prompt_ids))), "a prompt was lost or repeated"
    assert sum(r["state"] == "trained" for r in records) == 8 * 4
    assert {r["state"] for r in records} <= {"trained", "evicted", "aborted", "inflight", "ready"}
