"""Issue 28, item 1, for the sharded trainer: a learning rate changed on resume
trains (every rank sets the config's hyper-parameters on its restored
optimizer). The runs are in-process, their two ranks real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.run.resume_run import resume_run
from asyncrl.run.train import train
from tests.checkpoint.test_resume_changes import LR, NEW_LR, check_lr_trains
from tests.distributed.test_runs import FSDP2, QUIET, ROOT, SMALL

pytestmark = pytest.mark.e2e


def test_a_changed_learning_rate_trains_on_resume_with_two_ranks(tmp_path: Path,
                                                                   capsys) -> None:
    cfg = load_config(ROOT / "examples" / "quickstart.yaml", [
        "deterministic=true", "grpo.max_num_steps=1", "checkpoint.every_steps=0",
        f"policy.optimizer.lr={LR}", *QUIET, *SMALL, *FSDP2])
    base = tmp_path / "base"
    train(cfg, base)
    changed, plain = tmp_path / "changed", tmp_path / "plain"
    resume_run(base, ["grpo.max_num_steps=2", f"policy.optimizer.lr={NEW_LR}"], fork_to=changed)
    assert f"policy.optimizer.lr: {LR} -> {NEW_LR}" in capsys.readouterr().out
    resume_run(base, ["grpo.max_num_steps=2"], fork_to=plain)
    check_lr_trains(base, changed, plain)
