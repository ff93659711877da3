"""Rewards: the built-in reward functions, custom ones, and the pool that runs them.

``build_scorer(task, task_cfg)`` is the one factory: it returns the
:class:`~asyncrl.tasks.base.Scorer` for any task. A task may offer two optional
members (:mod:`asyncrl.tasks.capabilities`; the dataset task does):

* ``pooled_reward`` - the picklable function the workers call instead of
  ``task.reward`` (so a process worker need not receive the whole task);
* ``prepare_reward(prompt) -> Prompt`` - cheap, run on the event loop before a
  group is scored (e.g. attaching the dataset record the reward needs).
"""

from __future__ import annotations

from typing import Any, cast

from asyncrl.config.dataset import DatasetTaskConfig, RewardPoolConfig
from asyncrl.tasks.base import Task
from asyncrl.tasks.capabilities import HasConfig, PoolsReward, PreparesReward, TaskCapabilities
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
    caps = TaskCapabilities.of(task)
    if task_cfg is None and caps.cfg:
        task_cfg = cast(HasConfig, task).cfg
    # Only a dataset task's block has a reward block; the others take the defaults.
    cfg = task_cfg.reward if isinstance(task_cfg, DatasetTaskConfig) else RewardPoolConfig()
    reward = cast(PoolsReward, task).pooled_reward if caps.pooled_reward else task.reward
    prepare = cast(PreparesReward, task).prepare_reward if caps.prepare_reward else None
    return RewardPool.from_config(reward, cfg, prepare=prepare)


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
