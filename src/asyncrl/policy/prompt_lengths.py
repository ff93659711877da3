"""The longest prompt of a task, in tokens of the policy's tokenizer (what the
context-length check of :mod:`asyncrl.policy.context_length` measures).

* A task may know its bound (the built-in ones do):
  ``task.longest_prompt_text`` (:class:`~asyncrl.tasks.capabilities.KnowsLongestPrompt`) is a prompt as
  long as any it makes. With the task's own character tokenizer its length is
  exact; with another tokenizer (a pretrained model on a built-in task) it is a
  bound: one token per character, one more for a leading-space marker, plus bos.
* A task over the records of a file (:class:`~asyncrl.tasks.capabilities.HasRecords`,
  the dataset task): its prompts (after its template and chat template) are all
  encoded, as the engines encode them. With a pretrained tokenizer that takes a
  while on a large file, so the answer is cached on disk by content: the data
  file's hash, the prompt settings and the tokenizer. ``asyncrl validate``
  followed by ``asyncrl train`` scans the file once. The cache lives in
  ``$ASYNCRL_CACHE_DIR`` (default ``$XDG_CACHE_HOME/asyncrl``, else
  ``~/.cache/asyncrl``); a cache that cannot be read or written is skipped.
* Any other task (a library user's own, without either) has no known bound: None.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from asyncrl.tasks.capabilities import (
    HasRecords,
    KnowsLongestPrompt,
    TaskCapabilities,
    own_tokenizer,
)
from asyncrl.tasks.tokenizer import CharTokenizer, Tokenizer

#: Prompts encoded per call of a batched (fast) tokenizer.
_BATCH = 1024


@dataclass(frozen=True)
class LongestPrompt:
    """The longest prompt: its length in tokens (bos included), its text, and
    where it comes from (``""`` for a built-in task's bound)."""

    tokens: int
    text: str
    where: str = ""


def prompt_lengths(texts: Sequence[str], tokenizer: Tokenizer) -> list[int]:
    """Length in tokens of each prompt as an engine feeds it
    (:func:`~asyncrl.tasks.tokenizer.encode_prompt`: bos in front unless the text
    already starts with it); batched through a transformers tokenizer."""
    bos = tokenizer.bos_id
    if isinstance(tokenizer, CharTokenizer):  # one token per character
        return [len(t) + (bos is not None) for t in texts]
    inner = getattr(tokenizer, "tokenizer", None)  # asyncrl.policy.build.HFTokenizer
    if callable(inner):
        encoded: list[list[int]] = []
        for i in range(0, len(texts), _BATCH):
            encoded.extend(inner(list(texts[i:i + _BATCH]), add_special_tokens=False)["input_ids"])
    else:
        encoded = [tokenizer.encode(t) for t in texts]
    return [len(ids) + (bos is not None and (not ids or ids[0] != bos)) for ids in encoded]


def longest_of(texts: Sequence[str], tokenizer: Tokenizer) -> tuple[int, int] | None:
    """``(tokens, index)`` of the longest of ``texts`` (None when there are none)."""
    lengths = prompt_lengths(texts, tokenizer)
    if not lengths:
        return None
    index = max(range(len(lengths)), key=lengths.__getitem__)
    return lengths[index], index


def longest_prompt(task: Any, tokenizer: Tokenizer) -> LongestPrompt | None:
    """The longest prompt ``task`` gives the engines (see the module docstring)."""
    caps = TaskCapabilities.of(task)
    if caps.records:
        return _longest_record(cast(HasRecords, task), tokenizer)
    text = cast(KnowsLongestPrompt, task).longest_prompt_text if caps.longest_prompt_text \
        else None
    if not isinstance(text, str):
        return None
    tokens = prompt_lengths([text], tokenizer)[0]
    if tokenizer is not own_tokenizer(task):
        tokens = max(tokens, len(text) + 1 + (tokenizer.bos_id is not None))
    return LongestPrompt(tokens, text)


def _longest_record(task: HasRecords, tokenizer: Tokenizer) -> LongestPrompt | None:
    from asyncrl.tasks.data_files import record_location

    key = _cache_key(task, tokenizer)
    found = _cache_read(key)
    if found is None:
        texts = [task.make_prompt(i, position=i, epoch=0).text for i in range(task.num_records)]
        found = longest_of(texts, tokenizer)
        if found is None:
            return None
        _cache_write(key, found)
    tokens, index = found
    where = f"{task.cfg.path}, {record_location(task.cfg.path, task.format, index)}"
    return LongestPrompt(tokens, task.make_prompt(index, position=index, epoch=0).text, where)


# ------------------------------------------------------------------ cache
def cache_dir() -> Path:
    explicit = os.environ.get("ASYNCRL_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "asyncrl"


def _tokenizer_key(tokenizer: Tokenizer) -> str | None:
    """What determines how ``tokenizer`` encodes (None: unknown, so not cached)."""
    inner = getattr(tokenizer, "tokenizer", None)
    backend = getattr(inner, "backend_tokenizer", None)
    if backend is None:
        return None  # a character tokenizer is as fast to scan as the cache is to read
    return json.dumps([backend.to_str(), getattr(inner, "chat_template", None),
                       tokenizer.bos_id])


def _cache_key(task: HasRecords, tokenizer: Tokenizer) -> str | None:
    tok = _tokenizer_key(tokenizer)
    if tok is None:
        return None
    cfg = task.cfg
    shape = [task.fingerprint, task.num_records, cfg.prompt_key, cfg.template,
             cfg.chat_template, cfg.system_prompt, tok]
    return hashlib.sha256(json.dumps(shape).encode()).hexdigest()[:32]


def _cache_path(key: str) -> Path:
    return cache_dir() / "prompt_lengths" / f"{key}.json"


def _cache_read(key: str | None) -> tuple[int, int] | None:
    if key is None:
        return None
    try:
        data = json.loads(_cache_path(key).read_text())
        return int(data["tokens"]), int(data["index"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _cache_write(key: str | None, found: tuple[int, int]) -> None:
    if key is None:
        return
    path = _cache_path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as fh:
            json.dump({"tokens": found[0], "index": found[1]}, fh)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the next run scans again


__all__ = ["LongestPrompt", "cache_dir", "longest_of", "longest_prompt", "prompt_lengths"]
