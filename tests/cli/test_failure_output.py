"""Issue 28, item 5: what a failing run prints, through real ``asyncrl train`` processes.

A reward that raises (or hangs) fails every group in flight the same way. The
output must be a few lines, not one per group and attempt, and must name the
reward as what failed, with advice for the reward (not "Check the engines").
The hanging reward blocks on an event nobody sets, so its timeout is certain
whatever the machine's load: the test asserts what is printed, never a duration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "examples" / "data" / "number_words.jsonl"

REWARDS = '''
import threading


def boom(prompt, completion, answer, **record):
    raise ValueError("boom")


def hangs(prompt, completion, answer, **record):
    threading.Event().wait()  # never set: the call never returns
    return 1.0
'''

CONFIG = f"""
grpo: {{num_prompts_per_step: 8, num_generations_per_prompt: 2, max_num_steps: 1}}
async_rl:
  sampler: {{name: in_order, max_lookahead_versions: 1}}
  max_buffered_rollouts: 16
  min_groups_for_streaming_train: 8
  max_inflight_prompts: 16
  rollout_failure: {{max_infra_attempts_per_prompt: 2, backoff_base_s: 0.01}}
task:
  name: dataset
  path: {DATA}
  template: "{{word}} ="
  answer_key: answer
policy:
  model: {{hidden_size: 32, num_layers: 1, num_heads: 2, intermediate_size: 64}}
  generation: {{max_new_tokens: 2}}
logging: {{tensorboard: false, plots: false, progress: never}}
"""


def train(tmp_path: Path, *overrides: str) -> tuple[int, list[str]]:
    """Run ``asyncrl train`` on CONFIG with the rewards above importable; its
    exit code and its stderr lines."""
    (tmp_path / "flaky_rewards.py").write_text(REWARDS)
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    paths = [str(tmp_path), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(Path(p).resolve()) for p in paths if p)}
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl", "train", "--config", str(config),
         "--run-dir", str(tmp_path / "run"), *overrides],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    return proc.returncode, proc.stderr.strip().splitlines()


def test_a_reward_that_raises_is_reported_once_and_named(tmp_path: Path) -> None:
    code, lines = train(tmp_path, "task.reward={name: custom, target: 'flaky_rewards:boom'}")
    text = "\n".join(lines)
    assert code == 2, text
    # Sixteen groups fail alike: one line in full, one with the count and the groups.
    [first] = [line for line in lines if "attempt 1 failed" in line]
    assert "failed as data in the reward" in first and "ValueError: boom" in first
    repeats = [line for line in lines if "the same failure hit" in line]
    assert repeats and all("(retried; groups " in line for line in repeats), text
    assert len(lines) <= 7, text
    error = next(line for line in lines if line.startswith("asyncrl train: error:"))
    assert "Fix the reward function" in error, error
    assert "engine" not in text.lower(), text  # the reward failed, not an engine


def test_a_reward_that_times_out_is_the_rewards_failure_not_an_engines(tmp_path: Path) -> None:
    code, lines = train(tmp_path, "task.reward={name: custom, target: 'flaky_rewards:hangs', "
                                  "timeout_s: 0.05, num_workers: 2}")
    text = "\n".join(lines)
    assert code == 2, text
    error = next(line for line in lines if line.startswith("asyncrl train: error:"))
    assert "RewardTimeout" in error and "The reward is too slow or hangs" in error, error
    assert "Check the engines" not in text and "on engine" not in text, text
    assert all("failed as infra in the reward" in line
               for line in lines if "failed as infra" in line), text
    # Two kinds of failure (the timeout, then the pool refusing while its
    # threads hang), each in full once; the rest are counted.
    assert len([line for line in lines if "failed as infra" in line]) <= 2, text
    assert len(lines) <= 12, text
