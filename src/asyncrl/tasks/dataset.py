"""The dataset task: prompts from a local file, scored by a reward function.

``task: {name: dataset, path: data.jsonl, prompt_key, answer_key, template, ...}``
(see docs/tasks.md). The prompt text is the record's ``prompt_key`` field, or
``template`` formatted over the record; with ``chat_template: true`` it then
goes through the policy tokenizer's chat template (bound by the runner, see
:meth:`DatasetTask.bind_tokenizer`). The reward function always sees the text
before the chat template, the answer, and the record's other fields.
"""

from __future__ import annotations

import hashlib
import random
import string
import unicodedata
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from asyncrl.config.dataset import (
    DatasetTaskConfig,
    ExactMatchRewardConfig,
    MathVerifyRewardConfig,
    template_fields,
)
from asyncrl.errors import CheckpointError, ConfigError
from asyncrl.tasks.data_files import read_file, record_lines, record_location, record_source
from asyncrl.tasks.rewards.functions import (
    RESERVED,
    RecordReward,
    RewardFunction,
    build_reward_function,
    score_many,
)
from asyncrl.tasks.tokenizer import CharTokenizer, Tokenizer
from asyncrl.types import Prompt


def _fingerprint(path: str) -> str:
    """The content's hash (a resume refuses changed data): of the file, or of
    every file of a ``save_to_disk`` directory with its relative name."""
    root = Path(path).expanduser()
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
    digest = hashlib.sha256()
    for file in files:
        if root.is_dir():
            digest.update(str(file.relative_to(root)).encode() + b"\0")
        with file.open("rb") as fh:
            for block in iter(lambda fh=fh: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


class DatasetChanged(CheckpointError, ConfigError):
    """A resumed run's data file is not the one its checkpoint was made with: no
    older checkpoint fits either (a ConfigError: the data is what to fix)."""


class DatasetTask:
    """A :class:`~asyncrl.tasks.Task` over the records of a local file."""

    name = "dataset"

    def __init__(self, cfg: DatasetTaskConfig, *, load_reward: bool = True) -> None:
        """``load_reward``: resolve the reward now (a custom target is imported, so a
        bad one fails when the task is built, e.g. by ``asyncrl validate``); False:
        on first use - what needs the prompts and the tokenizer only (an export)
        then never imports the reward's module."""
        self.cfg = cfg
        self.target_reward = cfg.target_reward
        ds, self.format = read_file(cfg.path, cfg.format)
        if cfg.max_prompts is not None and cfg.max_prompts < len(ds):
            ds = ds.select(range(cfg.max_prompts))
        self._ds = ds
        self.num_records = len(ds)
        self.fingerprint = _fingerprint(cfg.path)
        self._fields = template_fields(cfg.template) if cfg.template else [cfg.prompt_key]
        self._check_keys([*self._fields, *([cfg.answer_key] if cfg.answer_key else [])])
        self._check_text_prompts()
        self._check_blank_prompts()
        needs_answer = (ExactMatchRewardConfig, MathVerifyRewardConfig)
        if cfg.answer_key is None and isinstance(cfg.reward, needs_answer):
            raise ConfigError(
                f"task.reward.name: {cfg.reward.name} compares with a reference answer, but "
                "task.answer_key is null; set answer_key to the field holding the answer"
            )
        #: Fields passed to the reward as ``**record``: all but the prompt and the answer.
        self.record_fields = [k for k in ds.column_names
                              if k not in (cfg.prompt_key, cfg.answer_key) and k not in RESERVED]
        self._chat: Any = None
        if load_reward:
            self.reward_function  # noqa: B018 - resolved now, see above

    @cached_property
    def reward_function(self) -> RewardFunction:
        """The configured reward function (a custom one imported on first access)."""
        return build_reward_function(self.cfg.reward, self.record_fields)

    @cached_property
    def pooled_reward(self) -> RecordReward:
        """What the reward pool's workers call (picklable, without the dataset)."""
        return RecordReward(self.reward_function)

    # ------------------------------------------------------------ records
    @cached_property
    def _lines(self) -> Sequence[int] | None:
        """A JSONL file's line of each record (read once, on first use): where
        a prompt came from, and where a record a check refuses is."""
        return record_lines(self.cfg.path) if self.format == "jsonl" else None

    def _where(self, index: int) -> str:
        where = record_location(self.cfg.path, self.format, index, self._lines)
        return f"dataset file {self.cfg.path!r}, {where}"

    def source(self, index: int) -> str:
        """Where record ``index`` is (a prompt's ``meta["source"]``: errors about
        the prompt name it), e.g. ``data/train.jsonl line 8``."""
        return record_source(self.cfg.path, self.format, index, self._lines)

    def _check_keys(self, keys: Sequence[str]) -> None:
        for key in keys:
            if key not in self._ds.column_names:
                role = "task.answer_key" if key == self.cfg.answer_key else (
                    "task.template" if self.cfg.template else "task.prompt_key")
                fix = ("name only those keys in task.template" if role == "task.template"
                       else f"set {role} to one of them")
                raise ConfigError(
                    f"dataset file {self.cfg.path!r}: no record has the key {key!r} ({role}); "
                    f"the records' keys are {', '.join(self._ds.column_names)}; {fix}"
                )
            missing = next((i for i, v in enumerate(self._ds[key]) if v is None), None)
            if missing is not None:
                raise ConfigError(
                    f"{self._where(missing)}: the key {key!r} is missing or null; give every "
                    "record a value for it (or remove the record)"
                )

    def _check_text_prompts(self) -> None:
        """Refuse a prompt field that is no text ({"question": 5}): the prompt is
        the field as it is, and a number or a list would be trained on as its
        Python repr unnoticed. A template formats any value: its fields may be."""
        if self.cfg.template is not None:
            return
        key = self.cfg.prompt_key
        bad = next((i for i, v in enumerate(self._ds[key]) if not isinstance(v, str)), None)
        if bad is not None:
            value = self._ds[bad][key]
            raise ConfigError(
                f"{self._where(bad)}: the key {key!r} (task.prompt_key) holds the "
                f"{type(value).__name__} {value!r}, not text; write the prompt as a string "
                f"(\"{value}\"), or set task.template (e.g. \"{{{key}}}\") to format it")

    def _check_blank_prompts(self) -> None:
        """Refuse a record whose prompt is empty or whitespace: the policy would be
        trained on completions of nothing. A template with text of its own never
        makes one; one made of fields alone does when all of its fields are blank."""
        template = self.cfg.template
        if template is not None and any(
                text.strip() for text, *_ in string.Formatter().parse(template)):
            return
        columns = [self._ds[key] for key in self._fields]
        blank = next((i for i, values in enumerate(zip(*columns, strict=True))
                      if not "".join(map(str, values)).strip()), None)
        if blank is not None:
            what = (f"task.template {template!r} makes an empty prompt of it" if template
                    else f"its {self.cfg.prompt_key!r} (task.prompt_key) is empty or blank")
            raise ConfigError(f"{self._where(blank)}: {what}; give every record a prompt "
                              "(or remove the record)")

    def record(self, index: int) -> dict[str, Any]:
        return self._ds[index]

    def raw_prompt(self, index: int) -> str:
        """The prompt text of record ``index`` before any chat template."""
        record = self.record(index)
        if self.cfg.template is None:
            return str(record[self.cfg.prompt_key])
        try:
            return self.cfg.template.format(**record)
        except (KeyError, IndexError, AttributeError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"{self._where(index)}: task.template {self.cfg.template!r} cannot be filled "
                f"from this record ({type(exc).__name__}: {exc}); fix the template or the record"
            ) from None

    def answer(self, index: int) -> Any:
        return None if self.cfg.answer_key is None else self.record(index)[self.cfg.answer_key]

    # ------------------------------------------------------------ tokens
    @cached_property
    def tokenizer(self) -> CharTokenizer:
        """For a from-scratch model: one token per character of the prompts,
        the answers and ``task.extra_chars``."""
        chars: set[str] = set(self.cfg.extra_chars)
        for index in range(self.num_records):
            text = self.raw_prompt(index) + str(self.answer(index) or "")
            bad = next((c for c in text if unicodedata.category(c) in ("Cs", "Co", "Cn")), None)
            if bad is not None:
                raise ConfigError(
                    f"{self._where(index)}: character {bad!r} (U+{ord(bad):04X}) cannot be a "
                    "token of the built-in character tokenizer; remove it, or use a pretrained "
                    "model (policy.model_name_or_path) whose tokenizer handles it"
                )
            chars.update(text)
        return CharTokenizer("".join(sorted(chars)))

    @property
    def needs_policy_tokenizer(self) -> bool:
        """True when prompts go through the policy tokenizer's chat template."""
        return self.cfg.chat_template

    def bind_tokenizer(self, tokenizer: Tokenizer) -> None:
        """Called by the runner before the first prompt, with the policy's
        tokenizer; with ``chat_template: true`` prompts are formatted with it."""
        if not self.cfg.chat_template:
            return
        hf = getattr(tokenizer, "tokenizer", None)
        if hf is None or not getattr(hf, "chat_template", None):
            raise ConfigError(
                "task.chat_template: true needs a pretrained tokenizer with a chat template, "
                f"but the policy's tokenizer ({type(tokenizer).__name__}) has none. Point "
                "policy.model_name_or_path at a chat model, or set task.chat_template: false "
                "(and use task.template to format prompts)"
            )
        self._chat = hf

    def engine_text(self, raw: str) -> str:
        """What the engine tokenizes for a prompt: ``raw``, through the chat template
        when it is on."""
        if not self.cfg.chat_template:
            return raw
        if self._chat is None:
            raise ConfigError(
                "task.chat_template: true, but no tokenizer was bound: call "
                "task.bind_tokenizer(tokenizer) before drawing prompts (asyncrl train does)"
            )
        messages = [{"role": "user", "content": raw}]
        if self.cfg.system_prompt is not None:
            messages.insert(0, {"role": "system", "content": self.cfg.system_prompt})
        return self._chat.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # ------------------------------------------------------------ the Task protocol
    def prompt_source(self, seed: int) -> DatasetPromptSource:
        return DatasetPromptSource(self, seed)

    def make_prompt(self, index: int, *, position: int, epoch: int) -> Prompt:
        return Prompt(prompt_id=position, text=self.engine_text(self.raw_prompt(index)),
                      answer=self.answer(index),
                      meta={"task": self.name, "index": index, "epoch": epoch,
                            "source": self.source(index)})

    def prepare_reward(self, prompt: Prompt) -> Prompt:
        """The prompt as the reward sees it: the text before the chat template,
        the answer, and the record's other fields in ``meta["record"]``."""
        index = prompt.meta.get("index")
        if not isinstance(index, int) or not 0 <= index < self.num_records:
            raise ConfigError(
                f"prompt {prompt.prompt_id} is not from this dataset (meta {prompt.meta!r})")
        record = self.record(index)
        return Prompt(prompt.prompt_id, self.raw_prompt(index), prompt.answer,
                      {"record": {k: record[k] for k in self.record_fields}})

    def reward(self, prompt: Prompt, completion: str) -> float:
        """Score one completion here, synchronously (the reward pool is the
        off-loop path; see :func:`asyncrl.tasks.rewards.build_scorer`)."""
        return score_many(self.pooled_reward, self.prepare_reward(prompt), [completion])[0]


class DatasetPromptSource:
    """The records in a seeded order: epoch ``e`` visits every record once, in
    the order ``shuffle(range(n))`` with a ``random.Random`` seeded by
    ``(seed, e)`` (file order without ``shuffle``). The state is the position
    alone, so a resumed run continues with exactly the next record."""

    def __init__(self, task: DatasetTask, seed: int) -> None:
        self.task = task
        self.seed = seed
        self.position = 0
        self._epoch = -1
        self._order: Sequence[int] = ()

    def order(self, epoch: int) -> Sequence[int]:
        """Record indices in the order epoch ``epoch`` visits them."""
        n = self.task.num_records
        if not self.task.cfg.shuffle:
            return range(n)
        if epoch != self._epoch:
            order = list(range(n))
            random.Random(f"dataset:{self.seed}:{epoch}").shuffle(order)
            self._epoch, self._order = epoch, order
        return self._order

    def next_prompt(self) -> Prompt | None:
        epoch, offset = divmod(self.position, self.task.num_records)
        epochs = self.task.cfg.epochs
        if epochs is not None and epoch >= epochs:
            return None
        prompt = self.task.make_prompt(self.order(epoch)[offset], position=self.position,
                                       epoch=epoch)
        self.position += 1
        return prompt

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "position": self.position,
                "num_records": self.task.num_records, "fingerprint": self.task.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, now in (("num_records", self.task.num_records),
                         ("fingerprint", self.task.fingerprint)):
            if key in state and state[key] != now:
                raise DatasetChanged(
                    f"the checkpoint was made with a different dataset file {self.task.cfg.path!r} "
                    f"({key} {state[key]!r}, now {now!r}); the position in the data would not "
                    "mean the same records. Restore the original file, or start a new run"
                )
        self.seed = int(state["seed"])
        self.position = int(state["position"])
