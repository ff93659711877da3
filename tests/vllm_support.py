"""Shared by the vLLM tests: a policy shape vLLM's CPU kernels accept, the
trainer's view of a finished group, and a check for leftover vLLM processes.

The vLLM tests never skip: ``make test`` installs vLLM, and a missing vLLM
fails them with the install hint (``asyncrl.errors.MissingDependency``).
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import psutil

from asyncrl.config import RunConfig, config_from_dict
from asyncrl.types import GroupResult, Prompt, Rollout

#: The default from-scratch model with 2 heads of size 32 (vLLM's CPU attention
#: takes no heads of size 16, which 4 heads of a 64-wide model would have).
VLLM_MODEL = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "intermediate_size": 128,
              "max_position_embeddings": 64}


def vllm_run_config(**blocks: Any) -> RunConfig:
    tree: dict[str, Any] = {
        "seed": 0,
        "policy": {"engine": "vllm", "model": dict(VLLM_MODEL),
                   "generation": {"max_new_tokens": 8}},
        "logging": {"progress": "never", "tensorboard": False, "plots": False},
    }
    for key, value in blocks.items():
        tree[key] = {**tree[key], **value} if isinstance(value, dict) and key in tree else value
    return config_from_dict(tree)


def as_rollout(result: GroupResult, prompt: Prompt) -> Rollout:
    """A finished group with arbitrary rewards, for the trainer to score."""
    rewards = [float(i % 2) for i in range(len(result.completion_ids))]
    return Rollout(result.group_id, prompt, result, rewards)


# ------------------------------------------------------------- processes
TAG = "ASYNCRL_TEST_PROCESS_TAG"


def tagged_env() -> tuple[dict[str, str], str]:
    """An environment whose processes (and their children) carry a unique tag."""
    tag = uuid.uuid4().hex
    return {**os.environ, TAG: tag}, tag


def tagged_processes(tag: str) -> list[psutil.Process]:
    """Live processes started with ``tag`` in their environment (vLLM's engine
    core and workers inherit it from the ``asyncrl`` process that started them)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.environ().get(TAG) == tag:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def wait_gone(procs: list[psutil.Process], timeout: float = 20.0) -> list[psutil.Process]:
    """Wait (on the processes, not by polling a clock) until they exit; the survivors."""
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    return [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]
