"""The engine as a rollout function sees it: one session per attempt of a prompt group.

A rollout function builds its group's completions as *transcripts*: per-token
records (:class:`~asyncrl.record.Completion`) that the session makes and extends,
turn by turn:

* :meth:`RolloutSession.generate`: the policy continues every unfinished
  transcript (one engine request for the whole group, continuing the tokens so
  far as ``GenerationRequest.prefix``). Its tokens keep the ids, behaviour
  log-probs and weight versions the engine reported: ``loss_mask`` 1.
* :meth:`RolloutSession.append`: the environment adds tokens (a tool's output,
  a user turn). They are not the policy's: ``loss_mask`` 0, behaviour log-prob
  0.0 (log 1: the environment's output is given, not sampled) and, by
  convention, the weight version of the newest policy token before them (the
  group's start weight when there is none): the version of the weights whose
  output the environment answered. Versions then never decrease along a
  transcript, as the record requires; the loss never reads them (loss_mask 0).
* :meth:`RolloutSession.finish`: the rollout function ends a transcript
  (the policy ending one with EOS, or at the length limit, ends it by itself).

Only transcripts the session made can be extended or returned, so every policy
token of a returned record is one the engine produced, with its exact version.
A transcript - policy and environment tokens together - is at most
``policy.generation.max_new_tokens`` long: the engine counts a prefix in it and
ends a transcript at the limit with ``finish_reason: length``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from asyncrl._util.text import plural
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.completions import empty, start_weight, text_of
from asyncrl.errors import BackendLost, GroupAborted, failure_kind
from asyncrl.record import Completion, FinishReason, GroupResult, spans_of
from asyncrl.tasks.tokenizer import Tokenizer
from asyncrl.types import GenerationRequest, Prompt


class RolloutContractError(ValueError):
    """A rollout function used its session or its record the wrong way (a bug
    in the function: not retried, the run stops naming it)."""


class EngineBug(RuntimeError):
    """The engine raised an unclassified error under a session (its ``__cause__``):
    carried through the rollout function, which is not at fault, to the wrapper,
    which raises the engine's error as it is (the controller names the engine)."""


@runtime_checkable
class RolloutSession(Protocol):
    """What a rollout function gets besides its prompt (see the module docstring)."""

    @property
    def prompt(self) -> Prompt:
        """The group's prompt (the same object the function gets)."""
        ...

    @property
    def num_generations(self) -> int:
        """How many completions the group needs (``grpo.num_generations_per_prompt``)."""
        ...

    @property
    def start_weight(self) -> int:
        """The group's start weight (``GroupResult.start_weight``): every token's
        version is at least this."""
        ...

    def start(self) -> list[Completion]:
        """Called first: one empty, unfinished transcript per generation."""
        ...

    async def generate(self, transcripts: Sequence[Completion], *,
                       stop: str | None = None) -> list[Completion]:
        """Called for every policy turn: the policy continues each unfinished
        transcript after its tokens (prompt + transcript as context); finished
        ones come back as they are. ``stop``: a turn ends right after the first
        token whose text completes this string (the tokens sampled after it are
        dropped, the transcript stays unfinished so the environment can answer;
        only the tokens of this turn are searched).
        Raises what the engine raises (a failed engine: ``GenerationError``);
        let it propagate, the controller classifies and retries it."""
        ...

    def append(self, transcript: Completion, observation: str | Sequence[int]) -> Completion:
        """Called for every environment step: ``transcript`` followed by
        ``observation`` (text, tokenized with the policy's tokenizer, or token
        ids) as environment tokens (``loss_mask`` 0). The transcript must be
        unfinished."""
        ...

    def finish(self, transcript: Completion, reason: FinishReason = "stop") -> Completion:
        """Called when the rollout function ends a transcript the policy left
        unfinished (e.g. no tool call, or out of turns). A finished transcript
        is returned as it is."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with the policy's tokenizer (no special tokens)."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` (special tokens left out)."""
        ...


class EngineSession:
    """The :class:`RolloutSession` over one engine, for one attempt of one group.

    Every :meth:`generate` is one engine request under the group's own id,
    start weight, seed and sampling settings (from ``request``), one at a time:
    so an abort of the group by id reaches the turn in flight.
    """

    def __init__(self, engine: RolloutEngine, request: GenerationRequest,
                 tokenizer: Tokenizer) -> None:
        self._engine = engine
        self._request = dataclasses.replace(request, prefix=None)
        self.tokenizer = tokenizer
        self.start_weight = start_weight(request, engine.weight_version)
        #: The prompt's token ids as the engine encoded them (None before a turn).
        self.prompt_ids: list[int] | None = None
        #: Engine requests made so far.
        self.turns = 0
        self._lock = asyncio.Lock()
        # Every transcript this session made, by identity: the provenance check.
        self._made: dict[int, Completion] = {}

    @property
    def prompt(self) -> Prompt:
        return self._request.prompt

    @property
    def num_generations(self) -> int:
        return self._request.num_generations

    def start(self) -> list[Completion]:
        return [self._own(empty()) for _ in range(self.num_generations)]

    async def generate(self, transcripts: Sequence[Completion], *,
                       stop: str | None = None) -> list[Completion]:
        transcripts = list(transcripts)
        self.check_made(transcripts, "generate")
        if all(t.finished for t in transcripts):
            return transcripts
        prefix = None
        if any(len(t) for t in transcripts):
            prefix = GroupResult(self._request.group_id, [], transcripts, self.start_weight)
        request = dataclasses.replace(self._request, num_generations=len(transcripts),
                                      prefix=prefix)
        async with self._lock:  # one request per group id in flight
            try:
                result = await self._engine.generate(request)
                if len(result.completions) != len(transcripts):
                    got = plural(len(result.completions), "completion")
                    raise ValueError(f"it returned {got} for num_generations={len(transcripts)}")
            except Exception as exc:
                if failure_kind(exc) is not None or isinstance(exc, (GroupAborted, BackendLost)):
                    raise
                raise EngineBug(f"the engine raised {type(exc).__name__}: {exc}") from exc
            self.turns += 1
        self.prompt_ids = list(result.prompt_ids)
        out = []
        for before, after in zip(transcripts, result.completions):
            if stop and not before.finished:
                after = self._cut(after, len(before), stop)
            out.append(self._own(after))
        return out

    def append(self, transcript: Completion, observation: str | Sequence[int]) -> Completion:
        self.check_made([transcript], "append")
        if transcript.finished:
            raise RolloutContractError(
                f"session.append to a finished transcript (finish_reason "
                f"{transcript.finish_reason!r}): the policy ended it; append only to "
                "unfinished transcripts")
        ids = self.encode(observation) if isinstance(observation, str) else list(observation)
        version = transcript.last_version
        env = Completion.of(ids, [0.0] * len(ids),
                            self.start_weight if version is None else version, None,
                            loss_mask=[0] * len(ids))
        return self._own(self._with_text(transcript.continued(env)))

    def finish(self, transcript: Completion, reason: FinishReason = "stop") -> Completion:
        self.check_made([transcript], "finish")
        if transcript.finished:
            return transcript
        return self._own(dataclasses.replace(transcript, finish_reason=reason))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    # ------------------------------------------------------------ internals
    def check_made(self, transcripts: Sequence[Completion], where: str) -> None:
        """Refuse a transcript this session did not make: its policy tokens'
        versions and log-probs could not be trusted to be the engine's."""
        for i, t in enumerate(transcripts):
            if self._made.get(id(t)) is not t:
                raise RolloutContractError(
                    f"{where}: transcript {i} was not made by this session; build transcripts "
                    "only with session.start / generate / append / finish, so that every "
                    "policy token keeps the weight version and log-prob the engine gave it")

    def _own(self, transcript: Completion) -> Completion:
        self._made[id(transcript)] = transcript
        return transcript

    def _with_text(self, c: Completion) -> Completion:
        return dataclasses.replace(c, text=text_of(self.tokenizer, c.token_ids))

    def _cut(self, c: Completion, start: int, stop: str) -> Completion:
        """``c`` up to the first of its tokens after ``start`` whose text
        completes ``stop``, unfinished (as it is when ``stop`` is not there)."""
        new = c.token_ids[start:]
        if stop not in self.decode(new):
            return c
        end = next(k for k in range(1, len(new) + 1) if stop in self.decode(new[:k]))
        if end == len(new) and c.finish_reason == "length":
            return c  # the stop string is its last token, at the length limit: it ended
        n = start + end
        versions = c.version_list()[:n]
        return self._with_text(Completion(
            c.token_ids[:n], c.logprobs[:n], spans_of(versions), None,
            loss_mask=None if c.loss_mask is None else c.loss_mask[:n]))


__all__ = ["EngineBug", "EngineSession", "RolloutContractError", "RolloutSession"]
