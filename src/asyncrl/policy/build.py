"""Build the policy: a transformers causal LM and the tokenizer the engine and trainer use.

This module only builds models; :mod:`asyncrl.run.backends` turns them into engines
and trainers (so engines and trainers never import each other or this module's
callers).

Two sources:

* ``policy.model_name_or_path: null`` (the default) - a Llama- or
  Qwen2-architecture model built from ``policy.model`` with random weights (seeded
  by the run seed), whose tokenizer is the task's
  :class:`~asyncrl.tasks.CharTokenizer`. Small by default (it trains from scratch
  on CPU in minutes); ``policy.model`` also takes a real model's shape knobs
  (vocabulary, grouped-query attention, tied embeddings, rope theta), so a
  Qwen2.5-0.5B-shaped model exists without a download (examples/qwen2_shape.yaml).
* ``policy.model_name_or_path: /some/dir`` - ``AutoModelForCausalLM`` and
  ``AutoTokenizer`` loaded from that local directory (never from the network),
  the tokenizer wrapped in :class:`HFTokenizer`.

Both are moved to ``policy.device`` in ``policy.dtype`` (``auto``: float32 on
CPU, bfloat16 on CUDA; see :func:`asyncrl.policy.devices.policy_dtype`).

transformers is an optional extra (``pip install 'asyncrl[hf]'``), imported here
only when a policy is built.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from asyncrl.config import ModelConfig, PolicyConfig
from asyncrl.errors import ConfigError, require
from asyncrl.policy.devices import check_device, policy_dtype
from asyncrl.tasks.capabilities import (
    BindsTokenizer,
    ChoosesBinding,
    TaskCapabilities,
    own_tokenizer,
)
from asyncrl.tasks.tokenizer import CharTokenizer, Tokenizer

if TYPE_CHECKING:
    from asyncrl.tasks.base import Task


class HFTokenizer:
    """A transformers tokenizer seen through the :class:`~asyncrl.tasks.Tokenizer` interface."""

    def __init__(self, tokenizer: Any) -> None:
        if tokenizer.eos_token_id is None:
            raise ConfigError(
                "the tokenizer has no eos token, so completions could never end; "
                "set eos_token in its tokenizer_config.json"
            )
        self.tokenizer = tokenizer
        self.eos_id = int(tokenizer.eos_token_id)
        # Many causal LMs define no pad token; padded positions are masked out
        # everywhere, so any id works and eos is the usual choice.
        pad = tokenizer.pad_token_id
        self.pad_id = int(pad) if pad is not None else self.eos_id
        bos = tokenizer.bos_token_id
        # Prompts get bos in front exactly when the tokenizer itself puts it there
        # (``tokenizer(text)``): then training, an exported policy and any inference
        # stack that tokenizes the text see the same ids. (A tokenizer that has a bos
        # token but does not add it, as GPT-2's, trains without it.)
        self.bos_id = int(bos) if bos is not None and _adds_bos(tokenizer, int(bos)) else None
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _adds_bos(tokenizer: Any, bos: int) -> bool:
    """Whether ``tokenizer(text)`` starts with ``bos`` by itself."""
    try:
        ids = tokenizer("a")["input_ids"]
    except Exception:  # cannot tell: put bos in front, as before this was asked
        return True
    return bool(ids) and ids[0] == bos


def build_policy(
    cfg: PolicyConfig, task: Task | None = None, *, seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> tuple[torch.nn.Module, Tokenizer]:
    """``(model, tokenizer)`` for ``cfg``; see the module docstring.

    ``tokenizer``: the policy's, when the caller has it already (a run's
    :class:`PolicyTokenizer`); else a pretrained model's is read from its
    directory, and a from-scratch model's vocabulary is ``task.tokenizer`` when
    the task has one (the built-in tasks do), else the default
    :class:`CharTokenizer`. Two calls with the same ``seed`` return models with
    identical weights.
    """
    transformers = require("transformers", "hf", "building the policy model")
    if cfg.model_name_or_path is not None:
        return _load_pretrained(transformers, cfg, tokenizer)

    if tokenizer is None:
        tokenizer = load_tokenizer(cfg, task)
    m = cfg.model
    check_model_shape(m, tokenizer.vocab_size)
    # transformers initialises weights from torch's global RNG; fork it so that
    # building a policy neither depends on nor disturbs anyone else's draws.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = _model_class(transformers, m)(model_config(transformers, m, tokenizer))
    return _prepare(model, cfg), tokenizer


def model_config(transformers: Any, m: ModelConfig, tokenizer: Tokenizer) -> Any:
    """The transformers config of the from-scratch model ``m`` over ``tokenizer``."""
    config_class = transformers.Qwen2Config if m.architecture == "qwen2" else transformers.LlamaConfig
    return config_class(
        vocab_size=m.vocab_size or tokenizer.vocab_size,
        hidden_size=m.hidden_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_key_value_heads or m.num_heads,
        intermediate_size=m.intermediate_size,
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": m.rope_theta},
        pad_token_id=tokenizer.pad_id,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
    )


def _model_class(transformers: Any, m: ModelConfig) -> Any:
    return (transformers.Qwen2ForCausalLM if m.architecture == "qwen2"
            else transformers.LlamaForCausalLM)


def check_model_shape(m: ModelConfig, tokenizer_vocab: int | None = None) -> None:
    """Refuse a from-scratch model shape transformers cannot build (or whose
    output layer would not cover the tokenizer's ids)."""
    if m.hidden_size % m.num_heads:
        raise ConfigError(
            f"policy.model.hidden_size={m.hidden_size} is not divisible by "
            f"policy.model.num_heads={m.num_heads} (each attention head gets hidden_size / "
            "num_heads dimensions); pick sizes that divide, e.g. hidden_size=64, num_heads=4"
        )
    kv = m.num_key_value_heads
    if kv is not None and m.num_heads % kv:
        raise ConfigError(
            f"policy.model.num_heads={m.num_heads} is not a multiple of "
            f"policy.model.num_key_value_heads={kv} (grouped-query attention shares each "
            "key/value head among num_heads / num_key_value_heads query heads); pick a "
            f"divisor, e.g. num_key_value_heads={_largest_divisor(m.num_heads, kv)}"
        )
    if m.vocab_size is not None and tokenizer_vocab is not None and m.vocab_size < tokenizer_vocab:
        raise ConfigError(
            f"policy.model.vocab_size={m.vocab_size} is smaller than the tokenizer's "
            f"vocabulary ({tokenizer_vocab} ids): the output layer must cover every id; "
            f"set vocab_size >= {tokenizer_vocab}, or null for exactly the tokenizer's"
        )


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def model_skeleton(cfg: PolicyConfig, tokenizer: Tokenizer) -> torch.nn.Module:
    """The policy's model on the ``meta`` device: every parameter's shape and no
    memory, nothing loaded or initialised (for memory estimates)."""
    transformers = require("transformers", "hf", "building the policy model")
    with torch.device("meta"):
        if cfg.model_name_or_path is None:
            m = cfg.model
            model = _model_class(transformers, m)(model_config(transformers, m, tokenizer))
        else:
            config = _from_pretrained(transformers.AutoConfig, _pretrained_dir(cfg))
            model = transformers.AutoModelForCausalLM.from_config(config)
    return model.eval()


def load_tokenizer(cfg: PolicyConfig, task: Task | None = None) -> Tokenizer:
    """The tokenizer :func:`build_policy` would use, without building the model
    (a pretrained one is read from its directory at every call: a run reads it
    once, through its :class:`PolicyTokenizer`)."""
    if cfg.model_name_or_path is None:
        return own_tokenizer(task) or CharTokenizer()
    transformers = require("transformers", "hf", "loading the policy's tokenizer")
    path = _pretrained_dir(cfg)
    return HFTokenizer(_from_pretrained(transformers.AutoTokenizer, path))


class PolicyTokenizer:
    """The policy's tokenizer for one run, read from disk at most once.

    A pretrained policy's tokenizer (``policy.model_name_or_path``) is read the
    first time a part of the run asks for it, and kept: the run makes one of
    these and hands it to every part that needs the tokenizer (the checks, a
    chat template, the policy, a rollout function, the final export). Where no
    part asks, nothing is read: a Ray driver, whose workers load the model, may
    not have its files. A from-scratch model's tokenizer is its task's own
    (:func:`load_tokenizer`), which the task keeps.
    """

    def __init__(self, policy: PolicyConfig) -> None:
        self.policy = policy
        self._pretrained: Tokenizer | None = None

    def get(self, task: Task | None = None) -> Tokenizer:
        """The policy's tokenizer (``task``: whose vocabulary a from-scratch model has)."""
        if self.policy.model_name_or_path is None:
            return load_tokenizer(self.policy, task)
        if self._pretrained is None:
            self._pretrained = load_tokenizer(self.policy)
        return self._pretrained


def check_prompts_encode(task: Task, cfg: PolicyConfig, tokenizer: Tokenizer, *,
                         seed: int = 0, sample: int = 64) -> None:
    """Refuse a tokenizer that cannot encode the task's text: a pretrained one
    that turns characters of the prompts into its unknown token (a character-level
    vocabulary from another task would silently train on prompts with holes in
    them), or a from-scratch model's (the task's own, e.g. a
    :class:`~asyncrl.tasks.CharTokenizer`) that lacks characters of the prompts
    or of the answers (the policy could never write them: an exact answer would
    be out of reach). ``tokenizer``: the policy's. The first ``sample`` prompts
    are checked."""
    own = cfg.model_name_or_path is None
    source = task.prompt_source(seed)
    for _ in range(sample):
        prompt = source.next_prompt()
        if prompt is None:
            return
        texts = {"prompt": prompt.text}
        if own and isinstance(prompt.answer, str):
            texts["answer"] = prompt.answer
        for what, text in texts.items():
            missing = _unencodable(tokenizer, text)
            if missing is None:
                continue
            shown = ", ".join(repr(ch) for ch in missing) or "some of its text"
            if own:
                raise ConfigError(
                    f"the task's tokenizer {tokenizer!r} (the vocabulary of a from-scratch "
                    f"model) cannot encode {shown} of the {what} {text!r}; give the task a "
                    "tokenizer that covers its prompts and answers (e.g. "
                    "CharTokenizer.for_text(...) over all of them)")
            raise ConfigError(
                f"policy.model_name_or_path={cfg.model_name_or_path!r}: its tokenizer cannot "
                f"encode {shown} of the prompt {text!r} (they become its unknown token); use a "
                "model whose tokenizer covers the task's text, or build one from scratch "
                "(policy.model_name_or_path: null)"
            )


def _unencodable(tokenizer: Tokenizer, text: str) -> list[str] | None:
    """The characters of ``text`` that ``tokenizer`` cannot encode (a character
    vocabulary raises for them, a pretrained one maps them to its unknown token),
    sorted; None when all of ``text`` encodes."""
    unk = getattr(getattr(tokenizer, "tokenizer", None), "unk_token_id", None)

    def fails(piece: str) -> bool:
        try:
            ids = tokenizer.encode(piece)
        except (ValueError, KeyError):
            return True
        return unk is not None and unk in ids  # byte-level tokenizers have no unk

    if not fails(text):
        return None
    return sorted({ch for ch in text if fails(ch)})


def check_vocabulary(cfg: PolicyConfig, tokenizer: Tokenizer) -> int | None:
    """Refuse a tokenizer with ids the model's embedding has no row for: the first
    such id in a prompt (or a pad in a batch) would fail deep inside the model's
    forward with an ``IndexError``. The model's vocabulary is read from its
    config (``config.json`` of ``policy.model_name_or_path``, or ``policy.model``),
    not by building it. Returns its size (the embedding's rows; None: unknown)."""
    if cfg.model_name_or_path is None:
        check_model_shape(cfg.model, tokenizer.vocab_size)  # names policy.model.vocab_size
        rows = cfg.model.vocab_size or tokenizer.vocab_size
        where = "policy.model (a from-scratch model)"
    else:
        rows = _pretrained_vocab_size(cfg)
        if rows is None:
            return None  # a config without a vocabulary size: nothing to check against
        where = f"policy.model_name_or_path={cfg.model_name_or_path!r}"
        if tokenizer.vocab_size > rows:
            raise ConfigError(
                f"{where}: its tokenizer has {tokenizer.vocab_size} ids but the model's "
                f"embedding has {rows} (config.json vocab_size), so ids {rows} and up index "
                "past it; resize the model to its tokenizer (model.resize_token_embeddings("
                "len(tokenizer)), then save_pretrained), or use the tokenizer the model was "
                "trained with")
    specials = {"pad": tokenizer.pad_id, "eos": tokenizer.eos_id, "bos": tokenizer.bos_id}
    beyond = {name: i for name, i in specials.items() if i is not None and not 0 <= i < rows}
    if beyond:
        shown = ", ".join(f"{name} id {i}" for name, i in beyond.items())
        need = max(beyond.values()) + 1
        fix = (f"set policy.model.vocab_size to {need} or more, or give the task's tokenizer a "
               "vocab_size that counts its special ids" if cfg.model_name_or_path is None else
               f"resize the model's embedding (model.resize_token_embeddings({need}), then "
               "save_pretrained), or give the tokenizer special tokens the model has")
        raise ConfigError(
            f"{where}: the tokenizer's {shown} is outside the model's embedding of {rows} "
            f"ids (0 to {rows - 1}); {fix}")
    return rows


def _pretrained_vocab_size(cfg: PolicyConfig) -> int | None:
    """``vocab_size`` of the model's ``config.json`` (a multimodal model's text part's)."""
    transformers = require("transformers", "hf", "loading policy.model_name_or_path")
    config = _from_pretrained(transformers.AutoConfig, _pretrained_dir(cfg))
    size = getattr(config.get_text_config(), "vocab_size", None)
    return int(size) if size is not None else None


def bind_task_tokenizer(task: Task, tokenizer: PolicyTokenizer) -> None:
    """Give a task that formats prompts with the policy's tokenizer (a dataset
    task with ``chat_template: true``) that tokenizer, before any prompt is drawn."""
    caps = TaskCapabilities.of(task)
    if not caps.bind_tokenizer:
        return
    # Only a task that formats prompts with it (chat_template) gets the tokenizer:
    # loading one needs the model directory, which a Ray driver may not have.
    if caps.needs_policy_tokenizer and not cast(ChoosesBinding, task).needs_policy_tokenizer:
        return
    cast(BindsTokenizer, task).bind_tokenizer(tokenizer.get(task))


def _pretrained_dir(cfg: PolicyConfig) -> Path:
    path = Path(cfg.model_name_or_path).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"policy.model_name_or_path={cfg.model_name_or_path!r} is not an existing directory. "
            "Give a local directory holding a transformers causal LM and its tokenizer "
            "(e.g. one written by save_pretrained), or null to build policy.model from scratch; "
            "models are never downloaded"
        )
    return path


def _from_pretrained(auto_class: Any, path: Path) -> Any:
    try:
        return auto_class.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # whatever a broken file makes transformers raise (KeyError too)
        raise ConfigError(
            f"policy.model_name_or_path={str(path)!r}: could not load a causal LM and its "
            f"tokenizer from it ({exc}). The directory needs config.json, the weights and the "
            "tokenizer files, as written by model.save_pretrained and tokenizer.save_pretrained"
        ) from exc


def _load_pretrained(transformers: Any, cfg: PolicyConfig,
                     tokenizer: Tokenizer | None) -> tuple[torch.nn.Module, Tokenizer]:
    path = _pretrained_dir(cfg)
    if tokenizer is None:
        tokenizer = load_tokenizer(cfg)
    model = _from_pretrained(transformers.AutoModelForCausalLM, path)
    # policy.dtype whatever the checkpoint's dtype: engine and trainer must
    # compute in the same one for their log-probs to agree.
    return _prepare(model, cfg), tokenizer


def _prepare(model: torch.nn.Module, cfg: PolicyConfig) -> torch.nn.Module:
    device = check_device(cfg.device)
    if cfg.engine_device is not None:
        check_device(cfg.engine_device, "policy.engine_device")
    # eval() for good, also while training: dropout would make the trainer's
    # log-probs differ from the engine's for the same weights, which the
    # off-policy corrections would then mistake for staleness.
    return model.to(device=device, dtype=policy_dtype(cfg.dtype, device)).eval()
