"""Tasks: where prompts come from and how completions are scored.

``build_task(cfg.task)`` turns a task config block into a :class:`Task`. Your own
task only needs the :class:`Task` protocol (see docs/training.md).
"""

from __future__ import annotations

from asyncrl.config import ArithmeticTaskConfig, ReverseTaskConfig, SortTaskConfig
from asyncrl.config.dataset import DatasetTaskConfig
from asyncrl.errors import ConfigError
from asyncrl.tasks.arithmetic import ArithmeticTask
from asyncrl.tasks.base import PromptSource, Scorer, Task
from asyncrl.tasks.common import SeededPromptSource, match_reward
from asyncrl.tasks.dataset import DatasetPromptSource, DatasetTask
from asyncrl.tasks.rewards import RewardPool, build_scorer
from asyncrl.tasks.strings import ReverseTask, SortTask
from asyncrl.tasks.tokenizer import CharTokenizer, Tokenizer

_TASKS = {
    ArithmeticTaskConfig: ArithmeticTask,
    ReverseTaskConfig: ReverseTask,
    SortTaskConfig: SortTask,
    DatasetTaskConfig: DatasetTask,
}


def build_task(cfg, *, load_reward: bool = True) -> Task:
    """The built-in task for a ``task`` config block (a config model or a plain dict).

    ``load_reward=False``: a dataset task resolves its reward on first use, not now
    (a custom reward's module is not imported by what needs only the prompts and
    the tokenizer, e.g. an export). The other tasks' rewards are built in.
    """
    if isinstance(cfg, dict):
        from pydantic import TypeAdapter, ValidationError

        from asyncrl.config import TaskConfig

        try:
            cfg = TypeAdapter(TaskConfig).validate_python(cfg)
        except ValidationError as exc:
            raise ConfigError(f"invalid task block: {exc}") from None
    try:
        task_class = _TASKS[type(cfg)]
    except KeyError:
        raise ConfigError(
            f"build_task: no built-in task for {type(cfg).__name__}; "
            f"use one of {sorted(c.__name__ for c in _TASKS)} or build your Task directly"
        ) from None
    if task_class is DatasetTask:
        return DatasetTask(cfg, load_reward=load_reward)
    return task_class(cfg)


__all__ = [
    "ArithmeticTask",
    "CharTokenizer",
    "DatasetPromptSource",
    "DatasetTask",
    "PromptSource",
    "ReverseTask",
    "RewardPool",
    "Scorer",
    "SeededPromptSource",
    "SortTask",
    "Task",
    "Tokenizer",
    "build_scorer",
    "build_task",
    "match_reward",
]
