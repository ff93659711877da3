"""The Ray backend with a vLLM rollout worker: a short run on a local Ray
instance completes with a balanced ledger, the worker loading every weight
version in order, and no vLLM process outlives the run."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from asyncrl.config import ModelConfig
from asyncrl.run.backends import build_backends
from asyncrl.run.train import train
from asyncrl.tasks import build_task
from tests.cluster.conftest import Probe, tiny_config
from tests.vllm_support import VLLM_MODEL, wait_gone

pytestmark = [pytest.mark.e2e, pytest.mark.ray, pytest.mark.slow]


def test_one_vllm_worker_runs_balanced_and_loads_every_version(ray_local, tmp_path: Path):
    steps = 6
    base = tiny_config(steps=steps, num_rollout_workers=1, actor_startup_timeout_s=300)
    # The same run with a vLLM worker: heads of 32, which vLLM's CPU kernels take.
    cfg = base.model_copy(update={"policy": base.policy.model_copy(update={
        "engine": "vllm", "model": ModelConfig(**VLLM_MODEL)})})
    task = build_task(cfg.task)
    engines, trainer = build_backends(cfg, task)
    probe = Probe(engines, trainer)
    vllm_procs = psutil.Process(engines[0].pid).children(recursive=True)
    assert vllm_procs, "the worker runs vLLM's engine core in processes of its own"

    summary = train(cfg, tmp_path, task=task, backends=(engines, trainer))

    ledger = summary["ledger"]
    assert summary["stop_reason"] == "max_num_steps", summary["stop_message"]
    assert ledger["balanced"] and ledger["trained"] == 4 * steps, ledger
    assert summary["staleness_max"] <= 1
    for _, gid, _, start, end, trainer_version in probe.results:
        assert start <= end <= trainer_version, (gid, start, end, trainer_version)
    assert probe.worker_log[0] == list(range(steps + 1))  # versions 0..steps, in order
    assert not wait_gone(vllm_procs, timeout=30), "vLLM processes outlived the worker"
