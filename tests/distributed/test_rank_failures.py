"""A rank that hangs ends the trainer within the collective timeout, with one
error naming it, and leaves no rank process behind (real processes, gloo,
world size 2). A rank killed mid-run: tests/distributed/test_runs.py."""

from __future__ import annotations

import os
import signal

import psutil
import pytest

from asyncrl.errors import TrainerRankLost
from asyncrl.run.options import sharded_options
from asyncrl.tasks import build_task
from asyncrl.trainers.distributed import build_local_trainer

from .helpers import config, fixed_rollouts, fsdp

# pytest's 300-s timeout: only a hang reaches it, also on a loaded machine (the
# hung rank is ended by the collective timeout, seconds).
pytestmark = pytest.mark.e2e

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


async def test_a_hung_rank_ends_the_call_within_the_collective_timeout() -> None:
    # The timeout also bounds the ranks' start-up (their store and first
    # collectives): 5 s, which only the stopped rank reaches, however loaded the
    # machine (at 1 s, a rank starting late under load could time out first).
    cfg = fsdp(config(trainer={"collective_timeout_s": 5.0}))
    trainer = build_local_trainer(sharded_options(cfg), TASK)
    pids = [p.pid for p in trainer.ranks.procs]
    try:
        os.kill(pids[1], signal.SIGSTOP)
        with pytest.raises(TrainerRankLost, match=rf"rank 1 \(pid {pids[1]}\) did not finish "
                                                  r"train_chunk of step 0.*timed out"):
            await trainer.train_chunk(fixed_rollouts(CFG, 2), step=0)
        assert gone(pids)
    finally:
        await trainer.close()
