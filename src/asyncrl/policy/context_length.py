"""Context length: every prompt and its completion must fit the model's context.

A model attends over at most ``max_position_embeddings`` positions, and vLLM
over ``max_model_len``. Past it, vLLM cuts a completion short while a
transformers model silently keeps going beyond the positions it was trained
on: two engines, two experiments. So nothing is ever cut at the context:

* before a run (``asyncrl validate`` and ``train``, :func:`check_context`): the
  longest prompt of the task (:mod:`asyncrl.policy.prompt_lengths`) plus
  ``policy.generation.max_new_tokens`` - and the longest held-out prompt plus
  ``eval.max_new_tokens`` - must fit the context the engine has; otherwise the
  run is refused with the numbers and the settings that fix it;
* while a run goes on (every built-in engine, :func:`check_prompt_fits`): a
  prompt for which ``prompt + max_new_tokens`` does not fit raises
  :class:`~asyncrl.errors.PromptTooLong` before anything is generated.

Every completion therefore ends at EOS or after ``max_new_tokens`` tokens, on
every engine: they stop at the same limit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from asyncrl.errors import ConfigError, PromptTooLong
from asyncrl.policy.prompt_lengths import LongestPrompt, longest_of, longest_prompt
from asyncrl.tasks.capabilities import records_path

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig
    from asyncrl.tasks.tokenizer import Tokenizer
    from asyncrl.types import Prompt

#: Attributes of a transformers model config that hold its context length, in
#: the order they are looked up (Llama-style first, then GPT-2, then others).
CONTEXT_ATTRIBUTES = ("max_position_embeddings", "n_positions", "max_sequence_length",
                      "seq_length")


@dataclass(frozen=True)
class ContextLimit:
    """The longest prompt + completion an engine takes, where that number comes
    from (as a user writes it), and the setting that raises it (None: none does)."""

    tokens: int
    source: str
    setting: str | None = None
    #: The limit above this one (the model's, above vLLM's max_model_len), if any.
    ceiling: ContextLimit | None = None


class _EvalLimit(Protocol):
    #: Length limit of eval completions (None: policy.generation.max_new_tokens).
    max_new_tokens: int | None


class HeldOut(Protocol):
    """What :func:`check_context` reads of the held-out prompts (the run's
    :class:`~asyncrl.controller.evaluation.Evaluator` is one): declared here, so
    that the policy's check does not import the controller."""

    prompts: Sequence[Prompt]
    settings: _EvalLimit


def context_of(model_config: Any) -> int | None:
    """The context length a transformers model config declares (None: none)."""
    configs = [model_config]
    text = getattr(model_config, "get_text_config", None)
    if callable(text):
        configs.insert(0, text())
    for config in configs:
        for name in CONTEXT_ATTRIBUTES:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
    return None


def model_context(policy: PolicyConfig) -> ContextLimit | None:
    """The policy model's context: ``policy.model.max_position_embeddings`` for a
    model built from scratch, else what its ``config.json`` declares."""
    if policy.model_name_or_path is None:
        n = policy.model.max_position_embeddings
        return ContextLimit(n, f"policy.model.max_position_embeddings={n}",
                            "policy.model.max_position_embeddings")
    from asyncrl.errors import require

    transformers = require("transformers", "hf", "reading the model's context length")
    path = Path(policy.model_name_or_path).expanduser()
    try:
        config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, KeyError):
        return None  # check_model_source reports an unreadable config
    n = context_of(config)
    return None if n is None else ContextLimit(n, f"the context of {path / 'config.json'} ({n})")


def engine_context(policy: PolicyConfig, cap: int | None) -> ContextLimit | None:
    """The context the configured engine works in: the model's, or ``cap`` when
    the engine sets one - ``policy.vllm.max_model_len`` on vLLM, which may not
    exceed the model's (:func:`asyncrl.engines.specs.context_cap` reads it)."""
    model = model_context(policy)
    if cap is None:
        return model
    if model is not None and cap > model.tokens:
        raise ConfigError(
            f"policy.vllm.max_model_len={cap} is above the model's context ({model.source}): "
            "positions past it were never trained (and vLLM refuses it). Set "
            f"policy.vllm.max_model_len to {model.tokens} or less, or null for the model's"
        )
    return ContextLimit(cap, f"policy.vllm.max_model_len={cap}", "policy.vllm.max_model_len",
                        ceiling=model)


def check_context(policy: PolicyConfig, task: Any, tokenizer: Tokenizer,
                  evaluator: HeldOut | None = None, *, cap: int | None) -> dict[str, Any]:
    """Refuse a run whose longest prompt plus ``policy.generation.max_new_tokens``
    does not fit the engine's context (also for the held-out prompts); returns the
    facts ``context_length`` and ``longest_prompt_tokens`` (None when unknown).
    ``cap``: the engine's own cap on the context (see :func:`engine_context`)."""
    limit = engine_context(policy, cap)
    if limit is None:
        return {"context_length": None, "longest_prompt_tokens": None}
    new_tokens = policy.generation.max_new_tokens
    longest = longest_prompt(task, tokenizer)
    _check_fits(longest, new_tokens, "policy.generation.max_new_tokens", limit,
                data=records_path(task))
    if evaluator is not None:
        texts = [p.text for p in evaluator.prompts]
        found = longest_of(texts, tokenizer)
        held_out = None if found is None else LongestPrompt(found[0], texts[found[1]],
                                                            "a held-out eval prompt")
        own = evaluator.settings.max_new_tokens
        _check_fits(held_out, own or new_tokens,
                    "eval.max_new_tokens" if own else "policy.generation.max_new_tokens", limit)
    return {"context_length": limit.tokens,
            "longest_prompt_tokens": None if longest is None else longest.tokens}


def _check_fits(longest: LongestPrompt | None, new_tokens: int, key: str, limit: ContextLimit,
                data: str | None = None) -> None:
    prompt = longest.tokens if longest is not None else 1  # unknown: at least one token
    need = prompt + new_tokens
    if need <= limit.tokens:
        return
    if longest is None:
        what = "a prompt of one token"
    else:
        text = longest.text if len(longest.text) <= 60 else longest.text[:57] + "..."
        where = f", {longest.where}" if longest.where else ""
        what = f"the longest prompt ({longest.tokens} tokens{where}: {text!r})"
    fixes = []
    ceiling = limit.ceiling
    if ceiling is not None and need > ceiling.tokens:  # vLLM's max_model_len and the model's
        if ceiling.setting is not None:
            fixes.append(f"raise {ceiling.setting} and {limit.setting} to {need} or more")
    elif limit.setting is not None:
        fixes.append(f"raise {limit.setting} to {need} or more")
    if limit.tokens > prompt:
        fixes.append(f"lower {key} to {limit.tokens - prompt} or less")
    if data is not None:
        fixes.append(f"leave the longest prompts out of {data}")
    fix = "; or ".join(fixes or ["use a model with a longer context"])
    raise ConfigError(
        f"context length: {what} plus {key}={new_tokens} needs {need} positions, but the "
        f"context is {limit.tokens} ({limit.source}), so completions would be cut short at the "
        f"context. {fix[0].upper()}{fix[1:]}"
    )


def check_prompt_fits(group_id: Any, prompt_tokens: int, max_new_tokens: int,
                      context: int | None) -> None:
    """Raise :class:`PromptTooLong` when a prompt of ``prompt_tokens`` tokens and
    ``max_new_tokens`` more do not fit ``context`` (None: no known limit).
    Called by every built-in engine before it generates a group."""
    if context is None or prompt_tokens + max_new_tokens <= context:
        return
    raise PromptTooLong(
        f"the prompt of group {group_id!r} is {prompt_tokens} tokens: with max_new_tokens="
        f"{max_new_tokens} it needs {prompt_tokens + max_new_tokens} positions, more than the "
        f"model's context of {context}, so its completions could be cut short at the context. "
        "Shorten or leave out that prompt, or lower max_new_tokens "
        "(policy.generation.max_new_tokens, or eval.max_new_tokens for held-out prompts)"
    )


__all__ = ["CONTEXT_ATTRIBUTES", "ContextLimit", "HeldOut", "check_context", "check_prompt_fits", "context_of", "engine_context", "model_context"]
