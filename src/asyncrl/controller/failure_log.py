"""Failure lines without the repetition: the same failure of many groups is one line.

A broken reward or engine fails every group in flight the same way: sixteen
groups give sixteen identical warnings (and sixteen more when they retry), and
the line that explains the stop scrolls away. :class:`FailureLog` logs the
first failure of each *kind* in full and only counts the same failure of other
groups; :meth:`FailureLog.flush` then writes one line per repeated kind with
the count and the groups. The kind (:func:`failure_key`) is the component that
failed and the error's text without the ids of the group it hit.

The controller flushes after every step, before it stops for an error and at
the end of the run, so a failure that keeps coming back in a long run is still
reported once per step, and a run that stops shows the count before the error.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import re
from collections.abc import Hashable, Sequence
from typing import Any

from asyncrl._util.compat import BaseExceptionGroup
from asyncrl._util.text import qualified_name
from asyncrl.errors import BackendBug, EngineRewardError, RewardError, TrainerError, add_note
from asyncrl.types import GroupId

#: Groups a repeat line names; the count covers the rest.
SHOWN_GROUPS = 12

_COMPLETION = re.compile(r"\bcompletion \d+: ")
_ATTEMPT = re.compile(r"\battempt \d+")
#: What may follow a prompt's id: where it came from, in parentheses.
_SOURCE = r"(?: \([^()]*\))?"


def blame(error: BaseException, *, engine: str, scoring: bool, scorer: str) -> str:
    """The component a failed attempt is charged to, in words: the reward for a
    :class:`~asyncrl.errors.RewardError` (its timeouts and lost workers too),
    ``scorer`` for another error raised while the group was scored, else
    ``engine`` (the engine that ran the attempt)."""
    if isinstance(error, RewardError) and not isinstance(error, EngineRewardError):
        return "the reward"
    return scorer if scoring else engine


def without_ids(text: str, group_id: GroupId, prompt_id: Hashable) -> str:
    """``text`` without what names one group: its id, its prompt's id, the
    attempt and the completion (the same failure of two groups differs only there).
    A leading ``prompt N: `` (how the reward pool starts its errors) is dropped,
    and so is where the prompt came from (``prompt N (data.jsonl line 8)``,
    :func:`~asyncrl.types.prompt_label`): it differs from group to group too."""
    text = _COMPLETION.sub("", text)
    for word, value in (("group", group_id), ("prompt", prompt_id)):
        source = _SOURCE if word == "prompt" else ""
        for shown in dict.fromkeys((repr(value), str(value))):
            own = rf"\b{word} {re.escape(shown)}(?!\w){source}"
            text = re.sub(rf"^{own}: ", "", text)
            text = re.sub(own, f"{word} ...", text)
    return _ATTEMPT.sub("attempt ...", text)


def error_line(error: BaseException) -> str:
    """``Type: first line of the message``: an error as a record or a summary
    names it (ledger.jsonl, summary.json's dropped prompts)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def failure_key(error: BaseException, component: str, group_id: GroupId,
                prompt_id: Hashable) -> str:
    """What the same failure of different groups shares: the component and the
    error (its type and first line, without the group's ids)."""
    lines = str(error).strip().splitlines()
    text = without_ids(lines[0] if lines else "", group_id, prompt_id)
    return f"{component}: {type(error).__name__}: {text}".rstrip(": ")


@dataclasses.dataclass
class _Repeats:
    #: What happened to the groups ("retried", "failed for good", ...).
    what: str
    #: The group the line logged in full named: never one of the "more".
    first: GroupId
    #: What failed: a "group", or a training "step".
    unit: str = "group"
    #: Groups that failed this way since the last flush (the first one excluded).
    groups: list[GroupId] = dataclasses.field(default_factory=list)
    #: Every group counted since the last flush: a group that fails this way
    #: again (its next attempt) is one group, not one more.
    counted: set[GroupId] = dataclasses.field(default_factory=set)
    count: int = 0


class FailureLog:
    """Per-group failure lines on ``log``, each kind in full once (see the module)."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        self._seen: dict[tuple[str, str], _Repeats] = {}

    def warn(self, what: str, key: str, group_id: GroupId, message: str, *args: object,
             unit: str = "group") -> None:
        """Log ``message % args`` for group ``group_id`` unless a failure of kind
        ``key`` that ended the same way (``what``: "retried", ...) was logged
        already; then count it for the next :meth:`flush`. ``unit``: what
        ``group_id`` numbers ("step": a training step's failure, by step)."""
        repeats = self._seen.get((what, key))
        if repeats is None:
            self._seen[what, key] = _Repeats(what, group_id, unit)
            self.log.warning(message, *args)
            return
        if group_id != repeats.first and group_id not in repeats.counted:
            repeats.counted.add(group_id)
            repeats.count += 1
            if len(repeats.groups) < SHOWN_GROUPS:
                repeats.groups.append(group_id)
        self.log.debug(message, *args)

    def flush(self) -> None:
        """One line per kind that repeated since the last flush: the count and the groups."""
        for (_, key), repeats in self._seen.items():
            if not repeats.count:
                continue
            shown = ", ".join(str(g) for g in repeats.groups)
            more = repeats.count - len(repeats.groups)
            unit = repeats.unit
            self.log.warning("the same failure hit %d more %s(s) too (%s; %ss %s%s): %s",
                             repeats.count, unit, repeats.what, unit, shown,
                             f" and {more} more" if more > 0 else "", key)
            repeats.count = 0
            repeats.groups.clear()
            repeats.counted.clear()


def causes(group: BaseExceptionGroup) -> list[BaseException]:
    """Every real error in a (nested) exception group, in order."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(causes(exc))
        elif not isinstance(exc, asyncio.CancelledError):
            out.append(exc)
    return out


def reported(errors: list[BaseException],
              repeats: dict[int, list[Any]] | None = None) -> BaseException:
    """The error a run that several tasks stopped raises: the first error, carrying every other one as a note: when several tasks
    fail, each error is reported once, not just the first. Errors with the same
    type and text are one line with their count; ``repeats`` (by ``id``) lists
    the other groups an error hit (:meth:`RunContext.fail`), noted on it."""
    unique = list({id(e): e for e in errors}.values())
    if not unique:
        return asyncio.CancelledError()
    for error in unique:
        groups = (repeats or {}).get(id(error))
        if groups:
            shown = ", ".join(str(g) for g in groups[:SHOWN_GROUPS])
            more = f" and {len(groups) - SHOWN_GROUPS} more" if len(groups) > SHOWN_GROUPS else ""
            add_note(error, f"the same error hit {len(groups)} more group(s) too: {shown}{more}")
    first, *others = unique
    counts = collections.Counter(f"{type(e).__name__}: {_first_line(e)}" for e in others)
    if counts:
        lines = "\n".join(f"  {text}" + (f" (x{n})" if n > 1 else "")
                          for text, n in counts.items())
        add_note(first, f"{len(others)} more error(s) stopped this run too:\n{lines}")
    return first


def trainer_failed(trainer: object, call: str, error: BaseException, step: int,
                   groups: Sequence[GroupId] = ()) -> TrainerError:
    """The one-line error for the trainer's ``call`` of step ``step`` raising
    ``error`` (an error of its own, not asyncrl's), naming the trainer, the call,
    the step and the step's ``groups``; the caller chains ``error`` as its cause."""
    shown = ", ".join(str(g) for g in groups[:SHOWN_GROUPS])
    more = f" and {len(groups) - SHOWN_GROUPS} more" if len(groups) > SHOWN_GROUPS else ""
    on = f" (groups {shown}{more})" if groups else ""
    return TrainerError(
        f"the trainer {qualified_name(trainer)} raised {type(error).__name__}: "
        f"{_first_line(error)} in {call} of step {step}{on}. Its state may be half-updated, "
        "so this step is not checkpointed; fix the cause (asyncrl -v prints the "
        "traceback), then resume from the last checkpoint")


def weight_load_failed(engine: object, idx: int, error: BaseException, version: int, *,
                       when: str, state: str) -> BackendBug:
    """The one-line error for engine ``idx``'s ``update_weights(weights, version)``
    raising ``error`` (an error of its own, not asyncrl's): a bug of that engine,
    whichever load it was. ``when``: which load (after a step, on resume);
    ``state``: what became of the run's state. ``error`` is chained as the cause
    (``asyncrl -v`` prints its traceback)."""
    bug = BackendBug(
        f"engine {idx} ({qualified_name(engine)}) raised {type(error).__name__}: "
        f"{_first_line(error)} in update_weights(weights, {version}) {when}. An engine's "
        f"update_weights must not raise: it is a bug in that engine. {state}; fix the "
        "engine, then resume the run from its checkpoint")
    bug.__cause__ = error
    return bug


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else ""


__all__ = ["FailureLog", "blame", "causes", "failure_key", "reported", "trainer_failed",
           "weight_load_failed", "without_ids"]
