"""Issue 12, cases 3-7, through real ``asyncrl`` processes: run directories, the
final checkpoint, resume with nothing to do, torn files, edited configs.

One short run (5 steps, a checkpoint every 2) is trained once per module; each
test works on a copy of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

STEPS = 5
CONFIG = f"""
seed: 3
grpo: {{num_prompts_per_step: 4, num_generations_per_prompt: 4, max_num_steps: {STEPS}}}
async_rl:
  sampler: {{name: in_order, max_lookahead_versions: 1}}
  max_buffered_rollouts: 8
  min_groups_for_streaming_train: 2
  max_inflight_prompts: 8
policy:
  model: {{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
  generation: {{max_new_tokens: 4}}
checkpoint: {{every_steps: 2, keep_last: 3}}
logging: {{tensorboard: false, plots: false, progress: never}}
"""


def asyncrl(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # Absolute PYTHONPATH entries: the same asyncrl is imported from any cwd.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p)}
    return subprocess.run([sys.executable, "-m", "asyncrl", *args], capture_output=True,
                          text=True, timeout=240, cwd=cwd, env=env)


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with its content hash."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def strict_json(text: str):
    def refuse(name: str):
        raise AssertionError(f"{name} in a JSON file")
    return json.loads(text, parse_constant=refuse)


def metric_steps(run: Path) -> list[int]:
    return [strict_json(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()]


def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle")
    (root / "c.yaml").write_text(CONFIG)
    proc = asyncrl("train", "--config", str(root / "c.yaml"), "--run-dir", str(root / "run"))
    assert proc.returncode == 0, proc.stderr
    return root


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    shutil.copytree(finished / "run", tmp_path / "run")
    return tmp_path / "run"


# ------------------------------------------------------------ case 4: final checkpoint
def test_a_final_checkpoint_when_steps_are_not_a_multiple_of_every_steps(finished: Path):
    run = finished / "run"
    # every_steps=2 and 5 steps: step 4 periodic, step 5 the final one.
    assert checkpoints(run) == ["step-000002", "step-000004", "step-000005"]
    summary = strict_json((run / "summary.json").read_text())
    assert summary["steps"] == STEPS and summary["ledger"]["balanced"]
    final = strict_json((run / "checkpoints" / "step-000005" / "controller.json").read_text())
    assert final["trainer_version"] == STEPS
    # It holds every group still pending when the run stopped (generated ahead for
    # the next step: ready, or in flight and cancelled by the stop), to be trained on
    # resume.
    pending = len(final["ready"]) + len(final["dispatch"]["inflight"])
    assert 0 < pending == summary["ledger"]["pending"]


# ------------------------------------------------------------ case 3: run directories
def test_an_existing_run_dir_is_refused_and_left_alone(finished: Path, run: Path, tmp_path):
    before = snapshot(run)
    proc = asyncrl("train", "--config", str(finished / "c.yaml"), "--run-dir", str(run))
    assert proc.returncode == 2
    assert "already holds a run" in proc.stderr and f"--resume {run}" in proc.stderr
    assert "--overwrite" in proc.stderr and snapshot(run) == before

    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    proc = asyncrl("train", "--config", str(finished / "c.yaml"), "--run-dir", str(a_file))
    assert proc.returncode == 2 and "is a file, not a directory" in proc.stderr
    assert "Traceback" not in proc.stderr

    cwd = tmp_path / "cwd"
    cwd.mkdir()
    proc = asyncrl("train", "--config", str(finished / "c.yaml"), "--run-dir", "", cwd=cwd)
    assert proc.returncode == 2 and "--run-dir is empty" in proc.stderr
    assert list(cwd.iterdir()) == []

    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("1,2\n")
    proc = asyncrl("train", "--config", str(finished / "c.yaml"), "--run-dir", str(other),
                   "--overwrite")
    assert proc.returncode == 2 and "is not an asyncrl run directory" in proc.stderr
    assert (other / "data.csv").read_text() == "1,2\n"


def test_overwrite_starts_the_run_over(finished: Path, run: Path) -> None:
    stale = run / "checkpoints" / "step-000099"
    shutil.copytree(run / "checkpoints" / "step-000005", stale)
    (run / "notes.txt").write_text("mine")
    proc = asyncrl("train", "--config", str(finished / "c.yaml"), "--run-dir", str(run),
                   "--overwrite", "grpo.max_num_steps=3")
    assert proc.returncode == 0, proc.stderr
    assert not stale.exists(), "an old checkpoint survived --overwrite"
    assert checkpoints(run) == ["step-000002", "step-000003"]
    assert metric_steps(run) == [0, 1, 2]
    assert (run / "notes.txt").read_text() == "mine"  # not a run file: left alone


def test_resume_with_run_dir_forks_and_leaves_the_source_alone(run: Path, tmp_path) -> None:
    before = snapshot(run)
    fork = tmp_path / "fork"
    proc = asyncrl("train", "--resume", str(run), "--run-dir", str(fork),
                   "grpo.max_num_steps=7")
    assert proc.returncode == 0, proc.stderr
    assert f"forking {run} at step-000005" in proc.stdout
    assert snapshot(run) == before
    assert metric_steps(fork) == list(range(7))
    assert checkpoints(fork) == ["step-000005", "step-000006", "step-000007"]
    summary = strict_json((fork / "summary.json").read_text())
    assert summary["steps"] == 7 and summary["ledger"]["balanced"]
    records = [strict_json(x) for x in (fork / "ledger.jsonl").read_text().splitlines()]
    assert sum(r["state"] == "trained" for r in records) == 7 * 4
    prompt_ids = [r["prompt_id"] for r in records]
    assert sorted(prompt_ids) == list(range(len(prompt_ids))), "a prompt was lost or repeated"


# ------------------------------------------------------ case 5: nothing left to do
@pytest.mark.parametrize("steps", [STEPS, 3])
def test_resume_with_nothing_to_do_says_so_and_changes_nothing(run: Path, steps: int) -> None:
    before = snapshot(run)
    proc = asyncrl("train", "--resume", str(run), f"grpo.max_num_steps={steps}")
    assert proc.returncode == 0, proc.stderr
    assert "nothing to do" in proc.stdout and f"at step {STEPS}" in proc.stdout
    assert f"asyncrl train --resume {run} grpo.max_num_steps=" in proc.stdout
    assert snapshot(run) == before


# ------------------------------------------------------ case 7: edited config.yaml
def test_an_edited_config_yaml_is_used_on_resume_and_checked(run: Path) -> None:
    config = run / "config.yaml"
    config.write_text(config.read_text().replace(f"max_num_steps: {STEPS}", "max_num_steps: 6"))
    proc = asyncrl("train", "--resume", str(run))
    assert proc.returncode == 0, proc.stderr
    assert f"grpo.max_num_steps: {STEPS} -> 6" in proc.stdout
    assert metric_steps(run) == list(range(6))

    config.write_text(config.read_text().replace("seed: 3", "seed: 4"))
    proc = asyncrl("train", "--resume", str(run), "grpo.max_num_steps=8")
    assert proc.returncode == 2
    assert f"in {config}" in proc.stderr and "seed: 3 -> 4" in proc.stderr
