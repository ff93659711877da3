"""A character tokenizer for the built-in tasks, and the tokenizer interface.

The engine and the trainer only ever talk to a tokenizer through the small
:class:`Tokenizer` interface below. :class:`CharTokenizer` implements it for
the built-in tasks (one token per character); :class:`asyncrl.policy.build.HFTokenizer`
wraps a transformers tokenizer the same way, so a real model plugs in unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

#: Every character a built-in task may use. A task usually builds its tokenizer
#: from the subset it needs (see :meth:`CharTokenizer.for_text`): a smaller
#: vocabulary means a randomly initialised policy hits useful characters more
#: often, so RL from scratch gets a learning signal sooner.
DEFAULT_CHARS = "0123456789abcdefghijklmnopqrstuvwxyz+-*=<> "

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine and the trainer need from a tokenizer."""

    #: Id used to pad batches; never sampled on purpose.
    pad_id: int
    #: Id that ends a completion.
    eos_id: int
    #: Id put in front of every prompt, or None when the model uses none.
    bos_id: int | None
    #: Number of ids the model's output layer must cover.
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without special tokens."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; special tokens (pad, bos, eos) are left out."""
        ...


class CharTokenizer:
    """One token per character; ids 0, 1, 2 are pad, bos and eos.

    >>> tok = CharTokenizer("0123456789+=")
    >>> tok.encode("3+5=")
    [6, 13, 8, 14]
    >>> tok.decode([11, tok.eos_id])
    '8'
    """

    pad_id = 0
    bos_id = 1
    eos_id = 2

    def __init__(self, chars: str = DEFAULT_CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError(f"CharTokenizer: characters must be distinct, got {chars!r}")
        self.chars = chars
        self._id_of = {c: i + 3 for i, c in enumerate(chars)}
        self.vocab_size = len(chars) + 3

    @classmethod
    def for_text(cls, *samples: str | Iterable[str]) -> CharTokenizer:
        """The tokenizer whose vocabulary is exactly the characters of ``samples``
        (in :data:`DEFAULT_CHARS` order, so the ids do not depend on the samples' order).

        Each sample is a string or an iterable of strings, so that the prompts and
        answers of a task can be passed as the lists they are:
        ``CharTokenizer.for_text(prompts, answers, "=")``. Anything else is a
        TypeError naming what it got.
        """
        used = set("".join(_texts(samples)))
        unknown = used - set(DEFAULT_CHARS)
        if unknown:
            raise ValueError(
                f"characters {''.join(sorted(unknown))!r} are not in the built-in character set "
                f"{DEFAULT_CHARS!r}; use only those"
            )
        return cls("".join(c for c in DEFAULT_CHARS if c in used))

    def encode(self, text: str) -> list[int]:
        try:
            return [self._id_of[c] for c in text]
        except KeyError as exc:
            raise ValueError(
                f"character {exc.args[0]!r} of {text!r} is not in this tokenizer's "
                f"vocabulary {self.chars!r}"
            ) from None

    def decode(self, ids: Iterable[int]) -> str:
        # Special and out-of-range ids decode to nothing: a policy can sample any
        # id its output layer has, and the reward then simply sees fewer characters.
        n = len(self.chars)
        return "".join(self.chars[i - 3] for i in ids if 3 <= i < n + 3)

    def __repr__(self) -> str:
        return f"CharTokenizer({self.chars!r})"


def _texts(samples: tuple[object, ...]) -> list[str]:
    """``for_text``'s samples as strings: a string as it is, an iterable's items."""
    texts: list[str] = []
    for sample in samples:
        if isinstance(sample, str):
            texts.append(sample)
            continue
        iterable = isinstance(sample, Iterable) and not isinstance(sample, (bytes, bytearray))
        items = list(sample) if iterable else [sample]
        bad = [x for x in items if not isinstance(x, str)]
        if not iterable or bad:
            raise TypeError(
                f"CharTokenizer.for_text takes strings, or iterables of strings (e.g. a list of "
                f"prompts); got {type(bad[0]).__name__} {bad[0]!r}"
                + (f" in a {type(sample).__name__}" if iterable else ""))
        texts.extend(items)
    return texts


def encode_prompt(tokenizer: Tokenizer, text: str) -> list[int]:
    """The token ids an engine feeds for prompt ``text``: the text's ids, with
    ``bos`` in front when the tokenizer has one and the text does not already
    start with it (a chat template often writes it into the text itself).

    Every engine tokenizes prompts through this one function, so the local and
    the vLLM engine see exactly the same ids and the trainer recomputes
    log-probs over the same sequence.
    """
    ids = tokenizer.encode(text)
    bos = tokenizer.bos_id
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos, *ids]
    if not ids:
        raise ValueError("empty prompt: a tokenizer without bos needs a non-empty prompt text")
    return ids
