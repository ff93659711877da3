"""Issue 18, case 10: small things an operator meets (the float noise in the
files: tests/metrics/test_jsonio.py; the resume refusal's keys: tests/checkpoint/test_store.py).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.controller.evaluation import build_evaluation
from asyncrl.policy.build import PolicyTokenizer
from asyncrl.tasks import build_task

ROOT = Path(__file__).resolve().parents[2]
DATASET = str(ROOT / "examples" / "dataset.yaml")


@pytest.fixture(autouse=True)
def in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # examples/dataset.yaml names its data relative to the repo


def eval_warnings(caplog: pytest.LogCaptureFixture, *overrides: str) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="asyncrl.eval"):
        cfg = load_config(DATASET, list(overrides))
        build_evaluation(cfg.eval, build_task(cfg.task), task_cfg=cfg.task, seed=cfg.seed,
                         tokenizer=PolicyTokenizer(cfg.policy))
    return [r.getMessage() for r in caplog.records]


def test_eval_on_the_training_file_and_greedy_pass_at_k_are_warned_about(
        caplog: pytest.LogCaptureFixture) -> None:
    # The docs' example evaluates on its training file on purpose (ten records).
    [same_file] = eval_warnings(caplog)
    assert "eval.path is the training file" in same_file and "eval.holdout" in same_file
    greedy = eval_warnings(caplog, "eval.num_generations=4")[-1]
    assert "eval/pass@4 equals eval/pass@1" in greedy and "eval.temperature > 0" in greedy
    assert eval_warnings(caplog, "eval.path=null", "eval.holdout=2",
                         "eval.num_generations=4", "eval.temperature=1.0") == []


def test_a_single_config_problem_is_one_line_after_error(capsys) -> None:
    assert main(["validate", "--config", DATASET, "eval.holdout=2"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("asyncrl validate: error: invalid command-line override: eval: "
                           "eval.path and eval.holdout both name held-out prompts")


@pytest.mark.e2e
def test_resume_on_a_data_file_with_new_characters_names_the_data_file(
        tmp_path: Path, capsys) -> None:
    data = tmp_path / "words.jsonl"
    data.write_text("".join(json.dumps({"word": w, "answer": a}) + "\n"
                            for w, a in (("one", "1"), ("two", "2"), ("six", "6"))))
    run = tmp_path / "run"
    small = ["policy.model.hidden_size=32", "policy.model.num_heads=2", "policy.model.num_layers=1",
             "grpo.num_prompts_per_step=2", "grpo.num_generations_per_prompt=2",
             "async_rl.max_buffered_rollouts=4", "async_rl.min_groups_for_streaming_train=2",
             "async_rl.max_inflight_prompts=4", "logging.progress=never", "logging.plots=false",
             "logging.tensorboard=false", "eval=null", f"task.path={data}"]
    assert main(["train", "--config", DATASET, "--run-dir", str(run), *small,
                 "grpo.max_num_steps=2", "checkpoint.every_steps=1"]) == 0
    with data.open("a") as fh:  # a new character: a from-scratch vocabulary one larger
        fh.write(json.dumps({"word": "ZERO", "answer": "0"}) + "\n")
    capsys.readouterr()
    assert main(["train", "--resume", str(run), "grpo.max_num_steps=4"]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint was made with a different dataset file" in err, err
    assert "size mismatch" not in err and "Restore the original file" in err


def test_a_path_that_is_no_run_directory_is_named_as_the_command_took_it(
        tmp_path: Path, capsys) -> None:
    """A new user's trial: export of an empty directory spoke of --resume, and
    --resume on a config file said "no such run directory"."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", str(empty), "--out", str(tmp_path / "hf")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"{empty} is not a run directory" in line, line
    assert "asyncrl export's RUN_DIR takes a directory that asyncrl train wrote" in line
    assert "--resume" not in line
    assert main(["train", "--resume", str(empty)]) == 2
    assert "--resume takes a directory that asyncrl train wrote" in capsys.readouterr().err

    config = tmp_path / "c.yaml"
    config.write_text("seed: 1\n")
    assert main(["train", "--resume", str(config)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"--resume {config} is a file, not a run directory" in line, line
    assert "--resume takes the directory a run wrote" in line and "pass it to --config" in line
    assert main(["export", str(config), "--out", str(tmp_path / "hf")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"{config}: is a file, not a run directory" in line, line
    assert not (tmp_path / "hf").exists()
