"""Issue 39 end to end (real processes, real time; no verdict depends on timing).

* ``save_by``: a real ``asyncrl train`` stops by itself with a checkpoint, exit
  code 75 and the resume hint, wherever the deadline falls on this machine; the
  resumed run balances its ledger and, in deterministic mode, ends with the
  weights of a run that was never stopped.
* SIGKILL while a checkpoint is written in the background: the previous one
  stays valid and the resume is exact.
* ``keep_best`` on a real run: the directory holds the newest plus the best k
  by the metric the run logged, and ``asyncrl export --best`` exports that one.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asyncrl.checkpoint import SAVE_BY_EXIT_CODE, load_latest, verify
from asyncrl.checkpoint.store import list_checkpoints
from asyncrl.cli import main
from asyncrl.config import load_config
from asyncrl.controller import RunDirSummary
from asyncrl.controller.stats import STEP_METRICS, measures_timing
from asyncrl.run.train import train
from asyncrl.types import StopReason

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
#: Deterministic mode on the quickstart (as tests/e2e/test_deterministic.py runs it).
DETERMINISTIC = [
    "deterministic=true", "logging.progress=never", "logging.tensorboard=false",
    "logging.plots=false", "checkpoint.every_steps=0",
    "async_rl.sampler.max_lookahead_versions=2", "async_rl.max_buffered_rollouts=24",
    "async_rl.min_groups_for_streaming_train=2",
]
ENDLESS = "grpo.max_num_steps=100000"


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not measures_timing(k)
             and k != "train/peak_memory_bytes"} for r in rows]


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return load_latest(run_dir).trainer_state["model"]


def assert_same_run(resumed: Path, reference: Path, steps: int) -> None:
    summary = json.loads((resumed / "summary.json").read_text())
    assert summary["steps"] == steps and summary["ledger"]["balanced"], summary["ledger"]
    records = [json.loads(x) for x in (resumed / "ledger.jsonl").read_text().splitlines()]
    ids = sorted(r["prompt_id"] for r in records)
    assert ids == list(range(len(ids))), "a prompt was lost or repeated"
    assert metrics(resumed) == metrics(reference)
    a, b = weights(resumed), weights(reference)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def reference_run(tmp_path: Path, steps: int) -> Path:
    ref = tmp_path / "uninterrupted"
    train(load_config(QUICKSTART, [*DETERMINISTIC, f"grpo.max_num_steps={steps}"]), ref)
    return ref


def test_save_by_stops_with_a_checkpoint_and_exit_75_and_resumes_exactly(
        tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    # An endless run with a deadline 20 s after its process started: wherever it
    # falls (after the first step on a slow machine, or many steps in), the run
    # must stop by itself, with a checkpoint.
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl", "train", "--config", str(QUICKSTART),
         "--run-dir", str(run), *DETERMINISTIC, ENDLESS, 'checkpoint.save_by="00:00:00:20"'],
        capture_output=True, text=True, timeout=600)  # the bound only ends a failure
    assert proc.returncode == SAVE_BY_EXIT_CODE == 75, proc.stderr[-3000:]
    assert f"resume with     asyncrl train --resume {run}" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == StopReason.SAVE_BY.value and summary["ledger"]["balanced"]
    assert "checkpoint.save_by deadline" in summary["stop_message"]
    stopped = summary["steps"]
    assert stopped >= 1 and load_latest(run).step == stopped

    steps = stopped + 2
    assert main(["train", "--resume", str(run), f"grpo.max_num_steps={steps}",
                 "checkpoint.save_by=null"]) == 0
    assert "resuming" in capsys.readouterr().out
    assert_same_run(run, reference_run(tmp_path, steps), steps)


def test_sigkill_during_a_background_write_keeps_the_previous_checkpoint(
        tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "-v", "train", "--config", str(QUICKSTART),
         "--run-dir", str(run), *DETERMINISTIC, ENDLESS, "checkpoint.every_steps=2"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    captured = 0
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # blocks on the child's output; no sleeping
            if "captured; writing it while training goes on" in line:
                captured += 1
                if captured == 2:  # the second checkpoint's write has begun
                    os.kill(proc.pid, signal.SIGKILL)
                    break
    finally:  # the endless run never outlives the test
        if proc.poll() is None and captured != 2:
            proc.kill()
        proc.wait(timeout=120)
    assert captured == 2 and proc.returncode == -signal.SIGKILL
    found = list_checkpoints(run)
    # Step 2's checkpoint, and step 4's if its write won the race with the kill:
    # never a partial one (the write renames a whole directory into place).
    assert [p.name for p in found][-1] == "step-000002"
    assert {p.name for p in found} <= {"step-000002", "step-000004"}
    assert all(verify(p) is None for p in found)

    steps = 8
    assert main(["train", "--resume", str(run), f"grpo.max_num_steps={steps}"]) == 0
    capsys.readouterr()
    assert_same_run(run, reference_run(tmp_path, steps), steps)


def test_keep_best_on_a_real_run_and_export_best(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    train(load_config(QUICKSTART, [
        "logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
        "grpo.max_num_steps=8", "checkpoint.every_steps=1", "checkpoint.keep_last=1",
        "checkpoint.keep_best={k: 2, metric: reward_mean, mode: max}"]), run)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    by_version = {r["trainer_version"]: r["reward_mean"] for r in rows}
    assert len(set(by_version.values())) > 2, "the metric never moved: nothing is ranked"
    ranked = sorted(by_version, key=lambda v: (by_version[v], v), reverse=True)
    expect = {max(by_version), *ranked[:2]}  # the newest and the best two
    assert {int(p.name[5:]) for p in list_checkpoints(run)} == expect
    summary = json.loads((run / "summary.json").read_text())
    assert summary["best_checkpoint"]["step"] == ranked[0]
    assert set(summary) <= RunDirSummary.__required_keys__ | RunDirSummary.__optional_keys__

    assert main(["export", str(run), "--best", "--out", str(tmp_path / "best")]) == 0
    assert f"step {ranked[0]} of {run}" in capsys.readouterr().out
    # Every number a step logs (less the trainer's and the evaluation's) is one
    # keep_best may rank by, and no listed one is missing from the records.
    logged = {k for k, v in rows[-1].items() if isinstance(v, (int, float))
              and not k.startswith(("train/", "eval/"))}
    listed = {k for k in STEP_METRICS if not k.startswith("train/")}
    assert logged <= listed and listed - logged <= {"time/generation_s"}, logged ^ listed


def test_a_checkpoint_write_that_fails_fails_the_run_naming_it(tmp_path: Path, capsys,
                                                                 monkeypatch) -> None:
    import errno

    from asyncrl.checkpoint import store

    def read_only(obj, fh) -> None:  # injected: the file system turned read-only
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(store, "_torch_save", read_only)
    run = tmp_path / "run"
    code = main(["train", "--config", str(QUICKSTART), "--run-dir", str(run),
                 "logging.progress=never", "logging.tensorboard=false", "logging.plots=false",
                 "grpo.max_num_steps=6", "checkpoint.every_steps=2"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "asyncrl train: error: writing checkpoint step-000002" in err
    assert "Read-only file system" in err
    assert list_checkpoints(run) == []  # no checkpoint, and none half written
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "error" and summary["ledger"]["balanced"]
