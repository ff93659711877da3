"""A rank that dies or hangs ends the trainer with one error naming it, and
leaves no rank process behind (real processes, gloo, world size 2)."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from asyncrl.errors import TrainerRankLost
from asyncrl.tasks import build_task
from asyncrl.trainers.distributed import build_local_trainer

from .helpers import config, fixed_rollouts, fsdp

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

CFG = config()
TASK = build_task(CFG.task)


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            pass
    return True


async def test_a_rank_killed_mid_step_is_named_and_every_rank_stops() -> None:
    trainer = build_local_trainer(fsdp(CFG), TASK, run_dir="/runs/exp")
    pids = [p.pid for p in trainer.ranks.procs]
    try:
        await trainer.train_chunk(fixed_rollouts(CFG, 2), step=0)
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(TrainerRankLost) as info:
            await trainer.finish_step(step=0)
        message = str(info.value)
        assert f"rank 1 (pid {pids[1]}) died during finish_step of step 0 (killed by SIGKILL)" \
            in message
        assert "asyncrl train --resume /runs/exp" in message
        assert gone(pids)
        with pytest.raises(TrainerRankLost):  # later calls fail at once, the same way
            await trainer.get_weights()
    finally:
        await trainer.close()
    assert gone(pids)


async def test_a_hung_rank_ends_the_call_within_the_collective_timeout() -> None:
    cfg = fsdp(config(trainer={"collective_timeout_s": 1.0}))
    trainer = build_local_trainer(cfg, TASK)
    pids = [p.pid for p in trainer.ranks.procs]
    try:
        os.kill(pids[1], signal.SIGSTOP)
        with pytest.raises(TrainerRankLost, match=rf"rank 1 \(pid {pids[1]}\) did not finish "
                                                  r"train_chunk of step 0.*timed out"):
            await trainer.train_chunk(fixed_rollouts(CFG, 2), step=0)
        assert gone(pids)
    finally:
        await trainer.close()
