"""Issue 28, items 1 and 9b, through real ``asyncrl train --resume`` processes:
what may change on resume takes effect.

* A changed learning rate trains: the next checkpoint's optimizer holds it, and
  in deterministic mode the resumed step moves the weights ``new / old`` times
  as far as the same step without the change (Adam's update is the learning
  rate times a function of the gradients, which are the same: same weights,
  same rollouts). Before the fix the restored optimizer kept the old rate.
* The reward's target may change on resume (the error after a reward failure
  says "fix, then resume"), reported like any other change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from asyncrl.checkpoint.store import read_trainer_state
from asyncrl.trainers.state import unshard_state
from tests.cli.test_run_lifecycle import asyncrl

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
LR, NEW_LR = 1e-3, 4e-3

#: One deterministic step of a small model, checkpointed at its end.
CONFIG = f"""
seed: 3
deterministic: true
grpo: {{num_prompts_per_step: 4, num_generations_per_prompt: 4, max_num_steps: 1}}
async_rl:
  sampler: {{name: in_order, max_lookahead_versions: 1}}
  max_buffered_rollouts: 8
  min_groups_for_streaming_train: 2
  max_inflight_prompts: 8
policy:
  model: {{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
  generation: {{max_new_tokens: 4}}
  optimizer: {{lr: {LR}}}
checkpoint: {{every_steps: 0, keep_last: 3}}
logging: {{tensorboard: false, plots: false, progress: never}}
"""


def trainer_state(run: Path, step: int) -> dict:
    return unshard_state(read_trainer_state(run / "checkpoints" / f"step-{step:06d}"))


def step_of_weights(before: dict, after: dict) -> dict[str, torch.Tensor]:
    return {k: after["model"][k] - before["model"][k] for k in before["model"]}


def check_lr_trains(base: Path, changed: Path, plain: Path) -> None:
    """The optimizer state and the weights of one step resumed from ``base`` with
    the learning rate changed (``changed``) and without (``plain``)."""
    start = trainer_state(base, 1)
    with_new, with_old = trainer_state(changed, 2), trainer_state(plain, 2)
    assert {g["lr"] for g in start["optimizer"]["param_groups"]} == {LR}
    assert {g["lr"] for g in with_new["optimizer"]["param_groups"]} == {NEW_LR}
    assert {g["lr"] for g in with_old["optimizer"]["param_groups"]} == {LR}
    moved_new = step_of_weights(start, with_new)
    moved_old = step_of_weights(start, with_old)
    scale = max(float(d.abs().max()) for d in moved_new.values())
    assert scale > 0, "the resumed step did not move the weights: nothing to compare"
    # AdamW without weight decay: the step is -lr * m_hat / (sqrt(v_hat) + eps).
    for key, d in moved_new.items():
        expected = moved_old[key] * (NEW_LR / LR)
        assert float((d - expected).abs().max()) <= 1e-3 * scale, key  # float32 rounding


def test_a_changed_learning_rate_trains_on_resume(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    base = tmp_path / "base"
    proc = asyncrl("train", "--config", str(config), "--run-dir", str(base))
    assert proc.returncode == 0, proc.stderr
    runs, said = {}, {}
    for name, extra in (("changed", [f"policy.optimizer.lr={NEW_LR}"]), ("plain", [])):
        runs[name] = tmp_path / name
        proc = asyncrl("train", "--resume", str(base), "--run-dir", str(runs[name]),
                       "grpo.max_num_steps=2", *extra)
        assert proc.returncode == 0, proc.stderr
        said[name] = proc.stdout
    check_lr_trains(base, runs["changed"], runs["plain"])
    # The final policies differ (before the fix they were byte-identical).
    final = [(runs[n] / "final" / "model.safetensors").read_bytes() for n in runs]
    assert final[0] != final[1]
    # The change is announced, and so is how it is applied.
    assert f"policy.optimizer.lr: {LR} -> {NEW_LR}" in said["changed"]
    assert "the optimizer resumes with the checkpoint's moments and these" in said["changed"]
    assert "policy.optimizer" not in said["plain"]


# ------------------------------------------------ item 9: the reward on resume, export
REWARD_CONFIG = f"""
seed: 1
grpo: {{num_prompts_per_step: 2, num_generations_per_prompt: 2, max_num_steps: 5}}
async_rl:
  max_buffered_rollouts: 4
  min_groups_for_streaming_train: 1
  max_inflight_prompts: 4
  # The prompt that failed the run is skipped: its step trains on the other one.
  rollout_failure: {{min_step_batch_fraction: 0.5}}
task:
  name: dataset
  path: {REPO / "examples" / "data" / "number_words.jsonl"}
  template: "{{word}} ="
  reward: {{name: custom, target: "rewards_v1:score"}}
policy:
  model: {{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
  generation: {{max_new_tokens: 2}}
logging: {{tensorboard: false, plots: false, progress: never}}
"""


def test_a_failed_reward_is_fixed_by_another_target_and_export_needs_no_reward(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rewards = tmp_path / "rewards"
    rewards.mkdir()
    (rewards / "rewards_v1.py").write_text(  # a bug on one record of the ten
        "def score(prompt, completion, answer, **record):\n"
        "    if answer == '3':\n"
        "        raise ValueError('a bug in the reward')\n"
        "    return 0.0\n")
    (rewards / "rewards_v2.py").write_text(
        "def score(prompt, completion, answer, **record):\n"
        "    return float(completion.strip() == str(answer))\n")
    config = tmp_path / "c.yaml"
    config.write_text(REWARD_CONFIG)
    run = tmp_path / "run"
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(rewards), path])))
    proc = asyncrl("train", "--config", str(config), "--run-dir", str(run))
    assert proc.returncode == 2 and "a bug in the reward" in proc.stderr
    # Its advice: "after fixing the cause, resume with: asyncrl train --resume RUN".
    assert f"resume with: asyncrl train --resume {run}" in proc.stderr
    # The fix is another function: before, "cannot resume with these settings changed".
    proc = asyncrl("train", "--resume", str(run), "task.reward.target=rewards_v2:score")
    assert proc.returncode == 0, proc.stderr
    assert "task.reward.target: 'rewards_v1:score' -> 'rewards_v2:score'" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 5 and summary["ledger"]["balanced"]
    # What the task block may not change still may not (the reward only).
    proc = asyncrl("train", "--resume", str(run), "grpo.max_num_steps=6", "task.shuffle=false")
    assert proc.returncode == 2 and "task.shuffle: True -> False" in proc.stderr

    # Item 9a: the export needs the weights and the tokenizer, not the reward,
    # whose module is not importable where the export runs.
    monkeypatch.setenv("PYTHONPATH", path)
    proc = asyncrl("export", str(run), "--out", str(tmp_path / "hf"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hf" / "model.safetensors").is_file()
