"""Run directories, issue 18 cases 4 and 7, with real processes.

* Case 7: two runs started together in one ``--run-dir``: one runs, the other
  is refused naming the holder's pid; ``--overwrite`` and ``--resume`` are
  refused while it runs; after a SIGKILL its lock is taken over by ``--resume``.
* Case 4: ``logging.wandb`` online without a login is refused by ``validate``
  and by ``train`` before anything is created; a run directory a failed start
  left behind (no checkpoint, no step) is reused without ``--overwrite``.
"""

from __future__ import annotations

import os
import re
import select
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.cli import main
from asyncrl.run.lock import LOCK_FILE
from tests.cli.test_signals import CONFIG, check_nothing_lost, strict_json

pytestmark = pytest.mark.e2e


def start(config: Path, run: Path, *overrides: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl", "train", "--config", str(config), "--run-dir", str(run),
         "grpo.max_num_steps=100000", "checkpoint.every_steps=1", *overrides],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def first_to_exit(procs: list[subprocess.Popen[str]], timeout: float) -> subprocess.Popen[str]:
    """The first of ``procs`` to exit (waiting on their pidfds, not polling)."""
    fds = {os.pidfd_open(p.pid): p for p in procs}
    try:
        ready, _, _ = select.select(list(fds), [], [], timeout)
        assert ready, f"none of the runs ended within {timeout} s"
        return fds[ready[0]]
    finally:
        for fd in fds:
            os.close(fd)


def wait_for_steps(proc: subprocess.Popen[str], steps: int) -> None:
    """Read the run's progress lines (blocking on its output) until ``steps`` showed."""
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        seen += " step " in line and "reward" in line
        if seen == steps:
            return
    pytest.fail(f"the run ended before {steps} steps (exit {proc.wait()})")


def test_one_run_per_directory_named_refusals_and_a_killed_runs_lock_taken_over(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    both = [start(config, run), start(config, run)]
    try:
        # Which of the two gets the directory is a race: the refused one ends first.
        loser = first_to_exit(both, timeout=120)
        assert loser.wait() == 2
        winner = both[1] if loser is both[0] else both[0]
        assert loser.stderr is not None
        err = loser.stderr.read()
        assert f"is in use by another asyncrl run (pid {winner.pid})" in err, err
        assert len(err.strip().splitlines()) == 1, err
        wait_for_steps(winner, 2)

        # A new run there is told the run is live and where to go instead - advice
        # that works when followed (issue 28, item 9c: it was told to --resume,
        # which was then refused).
        assert main(["train", "--config", str(config), "--run-dir", str(run),
                     "grpo.max_num_steps=1"]) == 2
        err = capsys.readouterr().err
        assert f"holds a run that is running now (pid {winner.pid})" in err, err
        assert "--resume" not in err.replace("neither resumed", "")
        advice = re.search(r"Pick another --run-dir, e.g. --run-dir (\S+), or wait", err)
        assert advice is not None, err
        assert main(["train", "--config", str(config), "--run-dir", advice.group(1),
                     "grpo.max_num_steps=1", "logging.progress=never"]) == 0
        assert strict_json((Path(advice.group(1)) / "summary.json").read_text())["steps"] == 1

        # While it runs: --overwrite would delete its files, --resume would race it.
        assert main(["train", "--config", str(config), "--run-dir", str(run), "--overwrite",
                     "grpo.max_num_steps=2"]) == 2
        assert f"(pid {winner.pid})" in capsys.readouterr().err
        assert main(["train", "--resume", str(run), "grpo.max_num_steps=100000"]) == 2
        out, err = capsys.readouterr()
        assert f"(pid {winner.pid})" in err and "resuming" not in out, out
        assert (run / "metrics.jsonl").is_file() and (run / "checkpoints").is_dir()

        winner.kill()  # SIGKILL: no chance to unlock; the kernel drops its lock
        winner.wait(timeout=60)
    finally:
        for p in both:
            if p.poll() is None:
                p.kill()
                p.wait()
    last = max(int(p.name.split("-")[-1]) for p in (run / "checkpoints").iterdir()
               if p.name.startswith("step-"))
    # Now that it is dead, a new run there is told to resume it: following that works.
    capsys.readouterr()
    assert main(["train", "--config", str(config), "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    advice = re.search(r"Continue it with: (asyncrl train --resume \S+);", err)
    assert advice is not None, err
    argv = shlex.split(advice.group(1))[1:]
    assert main([*argv, f"grpo.max_num_steps={last + 2}"]) == 0
    check_nothing_lost(run, steps=last + 2)
    assert (run / LOCK_FILE).read_text().split() == [str(os.getpid())]


#: Holds a run directory's lock, as a running ``asyncrl train`` does, until its stdin closes.
HOLD_THE_LOCK = """
import sys
from asyncrl.run.lock import run_dir_lock
with run_dir_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_resume_of_a_running_run_is_refused_before_it_announces_anything(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A new user's trial: ``--resume`` of a run still going printed "resuming ...
    from step-..." and then the lock's refusal."""
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run),
                 "grpo.max_num_steps=2", "checkpoint.every_steps=1",
                 "logging.progress=never"]) == 0
    capsys.readouterr()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(run)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        assert main(["train", "--resume", str(run), "grpo.max_num_steps=4"]) == 2
        out, err = capsys.readouterr()
        assert out == "", out  # no "settings changed", no "resuming"
        assert err.startswith(f"asyncrl train: error: {run} is in use by another asyncrl run "
                              f"(pid {holder.pid})"), err
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=60)
    assert main(["train", "--resume", str(run), "grpo.max_num_steps=3"]) == 0  # once it ended
    assert "resuming" in capsys.readouterr().out


@pytest.fixture
def no_wandb_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No W&B credentials anywhere (and no network to ask for them)."""
    for name in ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("NETRC", str(home / ".netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / "wandb-config"))
    monkeypatch.setenv("WANDB_DIR", str(home / "wandb-dir"))


def test_wandb_online_without_a_login_is_refused_before_anything_is_created(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_wandb_login: None) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    online = ["logging.wandb={mode: online}", "grpo.max_num_steps=2"]
    assert main(["validate", "--config", str(config), *online]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "logging.wandb.mode: online needs a W&B login" in err
    assert "wandb login" in err and "WANDB_API_KEY" in err and "mode: offline" in err
    run = tmp_path / "run"
    assert main(["train", "--config", str(config), "--run-dir", str(run), *online]) == 2
    assert "needs a W&B login" in capsys.readouterr().err
    assert not run.exists()
    # With a login (here a netrc entry, as `wandb login` writes) the check passes.
    (tmp_path / "home" / ".netrc").write_text("machine api.wandb.ai login user password k\n")
    assert main(["validate", "--config", str(config), "--json", *online]) == 0


def test_a_run_directory_that_never_trained_is_reused_without_overwrite(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    run = tmp_path / "run"
    # What a start that failed after the directory was made leaves (e.g. wandb
    # failing to start): the config, the lock file, an empty metrics file.
    run.mkdir()
    (run / "config.yaml").write_text(CONFIG)
    (run / "metrics.jsonl").write_text("")
    (run / LOCK_FILE).write_text("12345\n")
    steps = ["grpo.max_num_steps=2", "logging.progress=never"]
    assert main(["train", "--config", str(config), "--run-dir", str(run), *steps]) == 0
    summary = strict_json((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["ledger"]["balanced"]
    capsys.readouterr()
    # A directory that trained a step is still refused.
    assert main(["train", "--config", str(config), "--run-dir", str(run), *steps]) == 2
    assert "already holds a run" in capsys.readouterr().err
    # Without a checkpoint it cannot be resumed, and the advice does not say it can.
    shutil.rmtree(run / "checkpoints")
    assert main(["train", "--config", str(config), "--run-dir", str(run), *steps]) == 2
    err = capsys.readouterr().err
    assert "It has no checkpoint to resume from" in err and "--resume" not in err, err
    assert main(["train", "--config", str(config), "--run-dir", str(run), "--overwrite",
                 *steps]) == 0
