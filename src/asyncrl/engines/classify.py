"""How the built-in engines classify what goes wrong in them (docs/controller.md).

The controller cannot tell a ``ValueError`` of asyncrl's own code from one of
vLLM's input checks, so the engine decides where the error is raised: a
:class:`~asyncrl.errors.PromptError` when this prompt cannot be generated for
(data), a :class:`~asyncrl.errors.GenerationError` when the engine failed
(infra), and anything else passes through as a bug.
"""

from __future__ import annotations

from asyncrl.errors import BackendLost, GenerationError, PromptError, TokenizationError
from asyncrl.tasks.tokenizer import Tokenizer, encode_prompt
from asyncrl.types import GroupId, Prompt, prompt_label


def encode_prompt_or_fail(tokenizer: Tokenizer, prompt: Prompt) -> list[int]:
    """The prompt's token ids; a prompt the tokenizer rejects (a character it does
    not know, an empty prompt) is this prompt's fault: a data failure."""
    try:
        return encode_prompt(tokenizer, prompt.text)
    except ValueError as exc:
        raise TokenizationError(f"{prompt_label(prompt)} cannot be tokenized: {exc}") from exc


def vllm_failure(exc: Exception, group_id: GroupId, *, where: str = "its log") -> Exception:
    """The typed error for an exception out of vLLM's ``generate`` for one group:
    its engine core died (nothing left to retry on), it rejected the request
    (vLLM's input checks: data), or it failed to generate (infra). ``where``:
    where vLLM's own log says why."""
    from vllm.exceptions import VLLMClientError
    from vllm.v1.engine.exceptions import EngineDeadError

    if isinstance(exc, EngineDeadError):
        return BackendLost(f"the vLLM engine died while generating group {group_id!r} "
                           f"({exc}); {where} says why")
    if isinstance(exc, (VLLMClientError, ValueError)):
        return PromptError(f"vLLM rejected group {group_id!r}: {type(exc).__name__}: {exc}")
    cause = exc.__cause__ or exc
    return GenerationError(f"vLLM failed to generate group {group_id!r}: "
                           f"{type(cause).__name__}: {cause} ({where} has more)")


__all__ = ["encode_prompt_or_fail", "vllm_failure"]
