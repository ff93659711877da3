"""Config of the dataset task and its reward: ``task: {name: dataset, path: ..., reward: {...}}``.

A module of its own (:mod:`asyncrl.config.schema` puts it in the ``task``
union): the dataset task (:mod:`asyncrl.tasks.dataset`) and its reward read
these models. See docs/tasks.md for what every key does.
"""

from __future__ import annotations

import re
import string
from typing import Annotated, Literal, Union

from pydantic import Field, field_validator, model_validator

from asyncrl.config.blocks import Block, TaskBlock


# ------------------------------------------------------------------- reward
class RewardPoolConfig(Block):
    """Where and how long a reward function may run (every reward block has these).

    Built-in tasks have no reward block; their scorer uses these defaults.
    """

    #: Reward calls running at once.
    num_workers: Annotated[int, Field(ge=1)] = 4
    #: ``thread``: cheap, but a call that hangs past its timeout cannot be stopped
    #: (its thread is abandoned). ``process``: a hung call's process is killed and
    #: replaced; the reward function must be importable (a module-level function).
    executor: Literal["thread", "process"] = "thread"
    #: Longest one call may run; it then fails with RewardError (None: no limit).
    timeout_s: Annotated[float, Field(gt=0)] | None = 30.0


class ExactMatchRewardConfig(RewardPoolConfig):
    """1 when the completion equals the reference answer (after the options), else
    ``partial_credit`` times the fraction of characters in the right place."""

    name: Literal["exact_match"] = "exact_match"
    strip: bool = True
    ignore_case: bool = False
    #: Runs of whitespace count as one space.
    collapse_whitespace: bool = False
    partial_credit: Annotated[float, Field(ge=0, lt=1)] = 0.0


class RegexRewardConfig(RewardPoolConfig):
    """1 when ``pattern`` matches the completion (anywhere, or all of it with
    ``full_match``), else 0."""

    name: Literal["regex"] = "regex"
    pattern: str
    full_match: bool = False

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression ({exc}); fix the pattern") from None
        return value


class MathVerifyRewardConfig(RewardPoolConfig):
    """1 when the completion's final answer (a ``\\boxed{}`` or the last number or
    expression) is mathematically equal to the reference answer, else 0."""

    name: Literal["math_verify"] = "math_verify"


class CustomRewardConfig(RewardPoolConfig):
    """``target: "module:function"``, called as
    ``fn(prompt, completion, answer, **record) -> float`` (plain or ``async def``)."""

    name: Literal["custom"] = "custom"
    target: str


RewardConfig = Annotated[
    Union[  # noqa: UP007 - pydantic discriminated unions read clearer this way
        ExactMatchRewardConfig, RegexRewardConfig, MathVerifyRewardConfig, CustomRewardConfig
    ],
    Field(discriminator="name"),
]

REWARD_NAMES = ("exact_match", "regex", "math_verify", "custom")


# ---------------------------------------------------------------- the task
def template_fields(template: str) -> list[str]:
    """The record fields a template names, in order (``"{q} -> {a[0]}"`` -> q, a)."""
    fields: list[str] = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        head = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not head or head.isdigit():
            raise ValueError(
                f"template {template!r} has a positional field '{{{name}}}'; name the "
                "record field instead, e.g. '{question}'"
            )
        if head not in fields:
            fields.append(head)
    return fields


class DatasetTaskConfig(TaskBlock):
    """Prompts from a local JSONL, JSON, CSV or Parquet file, or a directory
    written by ``datasets.Dataset.save_to_disk``."""

    name: Literal["dataset"] = "dataset"
    path: str
    #: File format; ``auto`` reads it from the file name's extension (a
    #: directory: ``arrow``, what ``save_to_disk`` writes).
    format: Literal["auto", "jsonl", "json", "csv", "parquet", "arrow"] = "auto"
    prompt_key: str = "prompt"
    #: The reference answer's field (None: records have none; the reward gets None).
    answer_key: str | None = "answer"
    #: A format string over the record's fields (``"Q: {question}\nA:"``); None:
    #: the ``prompt_key`` field as it is.
    template: str | None = None
    #: Visit records in a seeded random order, a new one every epoch.
    shuffle: bool = True
    #: Passes over the data (None: endless).
    epochs: Annotated[int, Field(ge=1)] | None = None
    #: Use only the first N records of the file.
    max_prompts: Annotated[int, Field(ge=1)] | None = None
    #: Pretrained models: format prompts with the tokenizer's chat template.
    chat_template: bool = False
    #: System message put before every prompt (only with ``chat_template``).
    system_prompt: str | None = None
    #: From-scratch models: characters the tokenizer knows besides the data's own.
    extra_chars: str = ""
    #: Mean reward at which the task counts as learned (reported in summaries).
    target_reward: float = 0.9
    reward: RewardConfig = Field(default_factory=ExactMatchRewardConfig)

    @field_validator("template")
    @classmethod
    def _parses(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                template_fields(value)
            except ValueError as exc:
                if "positional field" in str(exc):
                    raise
                raise ValueError(
                    f"not a valid format string ({exc}); write fields as {{name}} and literal "
                    "braces as {{ and }}"
                ) from None
        return value

    @model_validator(mode="after")
    def _system_prompt_needs_chat_template(self) -> DatasetTaskConfig:
        if self.system_prompt is not None and not self.chat_template:
            raise ValueError(
                "task.system_prompt is used only with task.chat_template: true; set "
                "chat_template: true or remove system_prompt"
            )
        return self
