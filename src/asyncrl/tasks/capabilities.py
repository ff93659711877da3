"""What a task can offer beyond :class:`~asyncrl.tasks.Task`.

Each optional capability is a small protocol, named in :class:`TaskCapabilities`
by its member. They are read with :meth:`TaskCapabilities.of` (from the task's
class and its own attributes: a property such as a dataset task's tokenizer is
not evaluated by reading them), and a member is used only where the task has it.
``asyncrl validate --json`` lists them, and names a public attribute of the task that
looks like an optional member misspelled (:meth:`TaskCapabilities.misspelled`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast, runtime_checkable

from asyncrl._util.capabilities import Capabilities
from asyncrl.types import Prompt

if TYPE_CHECKING:
    from asyncrl.config.dataset import DatasetTaskConfig
    from asyncrl.tasks.tokenizer import Tokenizer

__all__ = [
    "BindsTokenizer",
    "ChoosesBinding",
    "HasConfig",
    "HasRecords",
    "HasTokenizer",
    "KnowsLongestPrompt",
    "PoolsReward",
    "PreparesReward",
    "TaskCapabilities",
    "own_tokenizer",
    "records_path",
]


@runtime_checkable
class HasTokenizer(Protocol):
    @property
    def tokenizer(self) -> Tokenizer:
        """Read when a from-scratch policy is built (``policy.model_name_or_path:
        null``) and by the pre-run checks: the policy's vocabulary. Without it:
        the default :class:`~asyncrl.tasks.CharTokenizer`."""
        ...


@runtime_checkable
class BindsTokenizer(Protocol):
    def bind_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Called once before the first prompt is drawn (by ``train``, ``validate``
        and ``export``), with the policy's tokenizer: a task that formats prompts
        with it (a chat template) keeps it."""
        ...


@runtime_checkable
class ChoosesBinding(Protocol):
    @property
    def needs_policy_tokenizer(self) -> bool:
        """Read right before ``bind_tokenizer``: False skips the call (loading a
        pretrained tokenizer needs the model directory, which a Ray driver may
        not have). Without it: True."""
        ...


@runtime_checkable
class PoolsReward(Protocol):
    @property
    def pooled_reward(self) -> Callable[[Prompt, str], float]:
        """Read once when the reward pool is built: the picklable function its
        workers call instead of ``reward`` (a process worker then need not
        receive the whole task)."""
        ...


@runtime_checkable
class PreparesReward(Protocol):
    def prepare_reward(self, prompt: Prompt) -> Prompt:
        """Called on the event loop before each group is scored (keep it cheap):
        the prompt as the reward sees it (e.g. with the record it needs)."""
        ...


@runtime_checkable
class KnowsLongestPrompt(Protocol):
    @property
    def longest_prompt_text(self) -> str:
        """Read by the context-length check before the run: a prompt as long as
        any the task makes. Without it (and without records to scan) the check
        leaves the prompts to the engines, which refuse one that does not fit."""
        ...


@runtime_checkable
class HasConfig(Protocol):
    @property
    def cfg(self) -> Any:
        """Read when a scorer is built for the task without a task block
        (``Controller(task=...)`` with no ``scorer``): the block the task was
        built from, whose ``reward`` settings (a dataset task's) size the pool."""
        ...


@runtime_checkable
class HasRecords(Protocol):
    """A task whose prompts are the records of a file (the dataset task):
    read by the context-length check (it scans every record for the longest
    prompt) and by evaluation (``eval.path`` / ``eval.holdout`` hold records out)."""

    @property
    def cfg(self) -> DatasetTaskConfig: ...

    @property
    def num_records(self) -> int: ...

    @property
    def fingerprint(self) -> str:
        """The content's hash (a cached scan is valid while it is the same)."""
        ...

    @property
    def format(self) -> str:
        """The file's format (where a record is, in messages)."""
        ...

    def raw_prompt(self, index: int) -> str:
        """Record ``index``'s prompt text, before any chat template."""
        ...

    def answer(self, index: int) -> Any: ...

    def make_prompt(self, index: int, *, position: int, epoch: int) -> Prompt:
        """Record ``index`` as the engines get it."""
        ...


@dataclasses.dataclass(frozen=True)
class TaskCapabilities(Capabilities):
    """Which optional protocols a task satisfies (one flag per protocol)."""

    MEMBERS: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "tokenizer": ("tokenizer",),
        "bind_tokenizer": ("bind_tokenizer",),
        "needs_policy_tokenizer": ("needs_policy_tokenizer",),
        "pooled_reward": ("pooled_reward",),
        "prepare_reward": ("prepare_reward",),
        "longest_prompt_text": ("longest_prompt_text",),
        "cfg": ("cfg",),
        "records": ("cfg", "num_records", "fingerprint", "format", "raw_prompt", "answer",
                    "make_prompt"),
    }
    REQUIRED: ClassVar[tuple[str, ...]] = ("name", "target_reward", "prompt_source", "reward")
    PROTOCOL: ClassVar[str] = "asyncrl.tasks.Task"

    tokenizer: bool = False
    bind_tokenizer: bool = False
    needs_policy_tokenizer: bool = False
    pooled_reward: bool = False
    prepare_reward: bool = False
    longest_prompt_text: bool = False
    cfg: bool = False
    records: bool = False


def own_tokenizer(task: Any) -> Tokenizer | None:
    """The task's own tokenizer (:class:`HasTokenizer`), or None when it has none."""
    if task is None or not TaskCapabilities.of(task).tokenizer:
        return None
    return cast(HasTokenizer, task).tokenizer


def records_path(task: Any) -> str | None:
    """The file a task's records come from (:class:`HasRecords`), or None."""
    if not TaskCapabilities.of(task).records:
        return None
    return cast(HasRecords, task).cfg.path
