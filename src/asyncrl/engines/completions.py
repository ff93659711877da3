"""What the built-in engines share to fill the per-token record
(:mod:`asyncrl.record`): the group's start weight, texts, and continuing
partial completions of a resumed group."""

from __future__ import annotations

from collections.abc import Sequence

from asyncrl.errors import GenerationError, TokenizationError
from asyncrl.record import Completion, GroupResult
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.types import GenerationRequest


def start_weight(request: GenerationRequest, held: int) -> int:
    """The group's start weight: the controller's (``request.start_weight``), a
    pinned version, or else the version the engine holds now."""
    if request.start_weight is not None:
        return request.start_weight
    if request.weight_version is not None:
        return request.weight_version
    return held


def refuse_pinned(request: GenerationRequest, held: int, engine: str) -> None:
    """An engine that holds only its newest weights cannot generate a group
    pinned to another version (deterministic runs pin them)."""
    if request.weight_version not in (None, held):
        raise GenerationError(
            f"group {request.group_id!r} is pinned to weight version {request.weight_version}, "
            f"but {engine} holds only version {held}; deterministic runs need "
            "policy.engine: local")


def prefix_of(request: GenerationRequest) -> list[Completion | None]:
    """Per completion, the partial completion it continues (None: from the prompt)."""
    n = request.num_generations
    if request.prefix is None:
        return [None] * n
    done = request.prefix.completions
    if len(done) != n:
        raise ValueError(f"group {request.group_id!r}: its prefix has {len(done)} completions, "
                         f"the request asks for num_generations={n}")
    return [c if c.token_ids or c.finished else None for c in done]


def text_of(tokenizer: Tokenizer, token_ids: Sequence[int]) -> str:
    """A completion's text: its tokens decoded, the final EOS left out."""
    ids = list(token_ids)
    if ids and ids[-1] == tokenizer.eos_id:
        ids = ids[:-1]
    return tokenizer.decode(ids)


def joined(prefix: Completion | None, new: Completion) -> Completion:
    """``new`` after the partial completion it continues."""
    return new if prefix is None else prefix.continued(new)


def with_texts(tokenizer: Tokenizer, completions: Sequence[Completion]) -> list[Completion]:
    """The completions with their texts decoded; a tokenizer that fails is a
    :class:`TokenizationError` (a data failure: the attempt is retried), never a crash."""
    try:
        return [Completion(c.token_ids, c.logprobs, c.versions, c.finish_reason,
                           text_of(tokenizer, c.token_ids), c.loss_mask) for c in completions]
    except Exception as exc:
        raise TokenizationError(f"decoding a completion failed: {exc!r}") from exc


def empty() -> Completion:
    """An unfinished completion with no tokens yet."""
    return Completion([], [], (), None)


def partial_result(request: GenerationRequest, prompt_ids: list[int], start: int,
                   completions: Sequence[Completion]) -> GroupResult:
    """A group's tokens so far (texts left empty: they are decoded when it finishes)."""
    return GroupResult(request.group_id, list(prompt_ids), list(completions), start)
