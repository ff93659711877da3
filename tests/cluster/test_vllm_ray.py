"""The Ray backend with a vLLM rollout worker: a short run on a local Ray
instance completes with a balanced ledger, the worker loading every weight
version in order, and no vLLM process outlives the run."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from asyncrl.cluster import build_ray_backends
from asyncrl.config import config_from_dict
from asyncrl.runner import train
from asyncrl.tasks import build_task
from tests.cluster.conftest import Probe
from tests.vllm_support import VLLM_MODEL, wait_gone

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_one_vllm_worker_runs_balanced_and_loads_every_version(ray_local, tmp_path: Path):
    steps = 6
    cfg = config_from_dict({
        "seed": 3,
        "grpo": {"num_prompts_per_step": 4, "num_generations_per_prompt": 4,
                 "max_num_steps": steps},
        "async_rl": {"sampler": {"name": "in_order", "max_lookahead_versions": 1},
                     "max_buffered_rollouts": 8, "min_groups_for_streaming_train": 2,
                     "max_inflight_prompts": 8},
        "policy": {"engine": "vllm", "model": VLLM_MODEL, "generation": {"max_new_tokens": 4}},
        "cluster": {"backend": "ray", "num_rollout_workers": 1,
                    "rollout_worker": {"num_cpus": 0.5}, "trainer": {"num_cpus": 0.5},
                    "actor_startup_timeout_s": 300},
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
    })
    task = build_task(cfg.task)
    engines, trainer = build_ray_backends(cfg, task)
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
