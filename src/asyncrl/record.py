"""The per-token record of a generation: what every engine returns, defined once.

A :class:`Completion` carries, per token, its id, its behaviour log-prob, the
weight version that sampled it and whether the policy chose it (``loss_mask``),
and per completion why it ended (``finish_reason``). A :class:`GroupResult` is
one prompt group's completions with the group's start weight. Engines fill the
record, the controller and the buffer carry it, checkpoints and Ray move it as
plain data (:meth:`GroupResult.to_dict` / :meth:`GroupResult.from_dict`), and
the trainer reads it token by token.

Invariants (checked when a record is made, so a broken engine fails at once):

* ``len(logprobs) == len(token_ids)`` and, when given, ``len(loss_mask)``;
* the weight versions are stored as run-length spans ``((version, count), ...)``
  whose counts add up to the number of tokens; versions never decrease along a
  completion (an engine's weights only move forward) and every count is >= 1;
* ``finish_reason`` is ``"stop"`` (the policy ended it: EOS), ``"length"`` (cut
  at ``max_new_tokens``) or None: *unfinished*, a partial completion kept at a
  stop or in a checkpoint, to be continued from its tokens.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

FinishReason = Literal["stop", "length"]
FINISH_REASONS = ("stop", "length")

#: Run-length spans of weight versions: ``((version, count), ...)``.
VersionSpans = tuple[tuple[int, int], ...]


def spans_of(versions: Iterable[int]) -> VersionSpans:
    """Run-length encode one weight version per token: ``[3, 3, 4] -> ((3, 2), (4, 1))``.
    The runs are counted in C (``len`` of a list), not token by token in Python."""
    return tuple((int(v), len(list(run))) for v, run in itertools.groupby(versions))


def counted(completions: Sequence[Completion]) -> list[tuple[Completion, int]]:
    """The distinct records among ``completions``, each with how many completions
    it stands for: ``[(c, n)]`` when one record is shared by all ``n`` of them
    (engines whose completions are alike share one, the simulator's do), else
    every completion once. What derives from a record alone (its length, spans,
    finish reason) is then derived once per record, not once per completion.

    Costs O(1) per completion for an engine's distinct records: ``list.count``
    (identity first, in C) runs only when the first and the last completion are
    one object already; a middle one that is another object but equal in
    contents counts as shared, which derives the same facts."""
    n = len(completions)
    if n == 1:
        return [(completions[0], 1)]
    if n:
        first = completions[0]
        if first is completions[-1] and completions.count(first) == n:
            return [(first, n)]
    return list(zip(completions, itertools.repeat(1)))


def _merge(a: VersionSpans, b: VersionSpans) -> VersionSpans:
    if a and b and a[-1][0] == b[0][0]:
        return (*a[:-1], (a[-1][0], a[-1][1] + b[0][1]), *b[1:])
    return (*a, *b)


@dataclass(frozen=True, slots=True)
class Completion:
    """One completion of a prompt group, token by token (see the module docstring).

    The lists are the record's own: treat them as read-only (a completion is
    shared by the buffer, checkpoints and the trainer).
    """

    token_ids: list[int]
    #: Behaviour log-prob of each token: under the distribution it was sampled
    #: from (after temperature / top-p), with the weights that sampled it.
    logprobs: list[float]
    #: The weight version that sampled each token, as run-length spans.
    versions: VersionSpans
    #: Why it ended; None: unfinished (a partial completion, to be continued).
    finish_reason: FinishReason | None
    #: The decoded completion (EOS left out), what rewards score.
    text: str = ""
    #: 1 for tokens the policy chose, 0 for tokens it did not (e.g. a tool's
    #: output in a multi-turn rollout); None means all ones.
    loss_mask: list[int] | None = None

    def __post_init__(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n:
            raise ValueError(f"Completion has {n} token ids but {len(self.logprobs)} logprobs; "
                             "an engine reports one behaviour log-prob per token")
        total, last = 0, -1
        for version, count in self.versions:
            if count < 1 or version < last or version < 0:
                raise ValueError(
                    f"Completion versions {self.versions!r}: spans must be (version, count) "
                    "with count >= 1 and versions >= 0 that never decrease along the completion")
            total, last = total + count, version
        if total != n:
            raise ValueError(f"Completion versions {self.versions!r} cover {total} tokens, but it "
                             f"has {n}; give every token the weight version that sampled it")
        if self.loss_mask is not None:
            if len(self.loss_mask) != n:
                raise ValueError(f"Completion loss_mask has {len(self.loss_mask)} entries for "
                                 f"{n} tokens")
            if any(m not in (0, 1) for m in self.loss_mask):
                raise ValueError("Completion loss_mask entries must be 0 or 1")
        if self.finish_reason is not None and self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Completion finish_reason {self.finish_reason!r}: one of "
                             f"{FINISH_REASONS} (or None for an unfinished completion)")

    # ------------------------------------------------------------ building
    @classmethod
    def of(cls, token_ids: Sequence[int], logprobs: Sequence[float],
           versions: int | Iterable[int], finish_reason: FinishReason | None, text: str = "",
           loss_mask: Sequence[int] | None = None) -> Completion:
        """A completion from one version per token (or one version for all)."""
        ids = list(map(int, token_ids))
        spans = (((int(versions), len(ids)),) if ids else ()) if isinstance(versions, int) \
            else spans_of(versions)
        return cls(ids, list(map(float, logprobs)), spans, finish_reason, text,
                   None if loss_mask is None else list(map(int, loss_mask)))

    def continued(self, more: Completion) -> Completion:
        """This (unfinished) completion followed by ``more``, the tokens generated
        after it; the text and finish reason are ``more``'s (an engine decodes
        the whole completion)."""
        if self.finished:
            raise ValueError("cannot continue a finished completion")
        mask = None
        if self.loss_mask is not None or more.loss_mask is not None:
            mask = [*(self.loss_mask or [1] * len(self)), *(more.loss_mask or [1] * len(more))]
        return Completion([*self.token_ids, *more.token_ids], [*self.logprobs, *more.logprobs],
                          _merge(self.versions, more.versions), more.finish_reason, more.text,
                          mask)

    # ------------------------------------------------------------- reading
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def first_version(self) -> int | None:
        return self.versions[0][0] if self.versions else None

    @property
    def last_version(self) -> int | None:
        return self.versions[-1][0] if self.versions else None

    def iter_versions(self) -> Iterator[int]:
        """The weight version of each token, in order."""
        for version, count in self.versions:
            yield from itertools.repeat(version, count)

    def version_list(self) -> list[int]:
        return list(self.iter_versions())

    def mask_list(self) -> list[int]:
        """``loss_mask`` with None expanded to all ones."""
        return list(self.loss_mask) if self.loss_mask is not None else [1] * len(self)

    # --------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {"token_ids": list(self.token_ids), "logprobs": list(self.logprobs),
                "versions": [list(s) for s in self.versions], "finish_reason": self.finish_reason,
                "text": self.text,
                "loss_mask": None if self.loss_mask is None else list(self.loss_mask)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Completion:
        mask = data.get("loss_mask")
        return cls([int(t) for t in data["token_ids"]], [float(x) for x in data["logprobs"]],
                   tuple((int(v), int(c)) for v, c in data["versions"]),
                   data.get("finish_reason"), str(data.get("text", "")),
                   None if mask is None else [int(m) for m in mask])


def built_valid(token_ids: Sequence[int], logprobs: Sequence[float], versions: VersionSpans,
                finish_reason: FinishReason) -> Completion:
    """A finished completion (no text, no loss mask) that its maker built valid:
    the :class:`Completion` it would construct, without the checks of
    ``__post_init__``. For producers whose records hold the invariants by
    construction and make one per generated group (the simulator, which builds
    ~10^5 a simulated run); an engine builds its records with the constructor,
    which checks them. The setters are the slots' own (a frozen dataclass's
    ``__setattr__`` refuses), so the object is what ``Completion(...)`` makes."""
    c = _NEW(Completion)
    _SET_TOKEN_IDS(c, token_ids)
    _SET_LOGPROBS(c, logprobs)
    _SET_VERSIONS(c, versions)
    _SET_FINISH_REASON(c, finish_reason)
    _SET_TEXT(c, "")
    _SET_LOSS_MASK(c, None)
    return c


_NEW = object.__new__
(_SET_TOKEN_IDS, _SET_LOGPROBS, _SET_VERSIONS, _SET_FINISH_REASON, _SET_TEXT,
 _SET_LOSS_MASK) = (vars(Completion)[name].__set__ for name in (
    "token_ids", "logprobs", "versions", "finish_reason", "text", "loss_mask"))


_TOKEN_IDS = operator.attrgetter("token_ids")
_LOGPROBS = operator.attrgetter("logprobs")
_TEXT = operator.attrgetter("text")
_FINISH_REASON = operator.attrgetter("finish_reason")


@dataclass(slots=True)
class GroupResult:
    """What an engine returns for one prompt group (see the module docstring).

    ``start_weight`` is the group's one start weight: the trainer version at
    which the controller reserved its slot (``GenerationRequest.start_weight``,
    which the engine echoes). Every token's version is at least that;
    ``end_weight`` is derived from the tokens: the newest version that sampled
    any of them.
    """

    group_id: Hashable
    prompt_ids: list[int]
    completions: list[Completion]
    start_weight: int
    #: Optional rewards computed by the engine (simulated engines); when None
    #: the controller scores ``completion_texts`` with the task.
    rewards: list[float] | None = None

    @property
    def end_weight(self) -> int:
        end = self.start_weight
        for c, _ in counted(self.completions):
            spans = c.versions
            if spans and spans[-1][0] > end:
                end = spans[-1][0]
        return end

    @property
    def finished(self) -> bool:
        """Every completion has ended (a partial group has not)."""
        return all(c.finish_reason is not None for c, _ in counted(self.completions))

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) * times for c, times in counted(self.completions))

    # Read-only views kept for readers of the former per-list layout (the
    # controller reads completion_texts once per group: the lists are built in C).
    @property
    def completion_ids(self) -> list[list[int]]:
        return list(map(_TOKEN_IDS, self.completions))

    @property
    def behavior_logprobs(self) -> list[list[float]]:
        return list(map(_LOGPROBS, self.completions))

    @property
    def completion_texts(self) -> list[str]:
        return list(map(_TEXT, self.completions))

    @property
    def finish_reasons(self) -> list[FinishReason | None]:
        return list(map(_FINISH_REASON, self.completions))

    def problem(self, *, start_weight: int, num_generations: int,
                finished: bool = True) -> str | None:
        """What makes this an invalid result of a request with this start weight
        and number of completions (None: it is valid); with ``finished`` every
        completion must have ended."""
        if self.start_weight != start_weight:
            return (f"start_weight {self.start_weight}, but the request said {start_weight} "
                    "(an engine echoes GenerationRequest.start_weight)")
        if len(self.completions) != num_generations:
            return f"{len(self.completions)} completions for num_generations={num_generations}"
        # A record shared by every completion is checked once (it is completion 0).
        for i, (c, _) in enumerate(counted(self.completions)):
            if finished and c.finish_reason is None:
                return f"completion {i} has no finish_reason (only a stop may return it unfinished)"
            first = c.versions[0][0] if c.versions else None
            if first is not None and first < start_weight:
                return (f"completion {i} has tokens of weight version {first}, older "
                        f"than the group's start weight {start_weight}")
        return None

    # --------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {"group_id": self.group_id, "prompt_ids": list(self.prompt_ids),
                "completions": [c.to_dict() for c in self.completions],
                "start_weight": self.start_weight,
                "rewards": None if self.rewards is None else list(self.rewards)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupResult:
        rewards = data.get("rewards")
        return cls(data["group_id"], [int(t) for t in data["prompt_ids"]],
                   [Completion.from_dict(c) for c in data["completions"]],
                   int(data["start_weight"]),
                   None if rewards is None else [float(x) for x in rewards])


__all__ = ["FINISH_REASONS", "Completion", "FinishReason", "GroupResult", "VersionSpans",
           "built_valid", "counted", "spans_of"]
