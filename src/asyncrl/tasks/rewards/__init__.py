"""Rewards: the built-in reward functions, custom ones, and the pool that runs them.

``build_scorer(task, task_cfg)`` is the one factory: it returns the
:class:`~asyncrl.tasks.base.Scorer` for any task. A task may offer two optional
hooks (the dataset task does):

* ``pooled_reward`` - the picklable function the workers call instead of
  ``task.reward`` (so a process worker need not receive the whole task);
* ``prepare_reward(prompt) -> Prompt`` - cheap, run on the event loop before a
  group is scored (e.g. attaching the dataset record the reward needs).
"""

from __future__ import annotations

from typing import Any

from asyncrl.config.dataset import RewardPoolConfig
from asyncrl.tasks.base import Task
from asyncrl.tasks.rewards.functions import (
    ExactMatch,
    MathVerify,
    RecordReward,
    Regex,
    build_reward_function,
    load_custom_reward,
    score_many,
)
from asyncrl.tasks.rewards.pool import RewardPool


def build_scorer(task: Task, task_cfg: Any = None) -> RewardPool:
    """The scorer for ``task``: its reward in a :class:`RewardPool` configured by
    ``task_cfg.reward`` (num_workers, executor, timeout_s), or by the
    :class:`~asyncrl.config.dataset.RewardPoolConfig` defaults when the task
    config has no reward block (the built-in tasks).

    ``task_cfg`` defaults to the task's own config (``task.cfg``, which every
    task :func:`~asyncrl.tasks.build_task` builds has): a script building a
    :class:`~asyncrl.controller.Controller` from a task gets the pool ``asyncrl
    train`` builds from the same config.
    """
    if task_cfg is None:
        task_cfg = getattr(task, "cfg", None)
    cfg = getattr(task_cfg, "reward", None) or RewardPoolConfig()
    reward = getattr(task, "pooled_reward", None) or task.reward
    return RewardPool.from_config(reward, cfg, prepare=getattr(task, "prepare_reward", None))


__all__ = [
    "ExactMatch",
    "MathVerify",
    "RecordReward",
    "Regex",
    "RewardPool",
    "build_reward_function",
    "build_scorer",
    "load_custom_reward",
    "score_many",
]
