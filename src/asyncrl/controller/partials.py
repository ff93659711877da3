"""Partial rollouts at checkpoints and stops: no generated token is lost.

A group still generating when a checkpoint is written, or when the run stops
gracefully, is saved with the tokens it has so far (``Entry.partial``); on
resume it continues from them (``Entry.prefix``, sent to the engine as
``GenerationRequest.prefix``) instead of being generated again from scratch.

* Before a checkpoint, :func:`read_partials` asks each engine for the tokens of
  its generating groups without stopping them (the optional
  ``snapshot(group_ids)`` engine method; an engine without it keeps only the
  prompts of its groups, as before).
* At a graceful stop, :func:`stop_generating` aborts every generating group:
  the engine's ``generate`` raises ``GroupAborted`` with the tokens it had
  (``partial``), which the attempt runner keeps; the group stays pending.
* A finished group being scored keeps its whole result (the attempt runner
  sets ``Entry.partial`` as soon as generation returns).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Iterable, Sequence

from asyncrl.controller.entry import Entry, EntryState
from asyncrl.engines.base import RolloutEngine
from asyncrl.engines.capabilities import EngineCapabilities
from asyncrl.types import GroupResult

log = logging.getLogger("asyncrl.controller")

#: How long a graceful stop waits for the engines to hand back the tokens of
#: the groups they were generating. An engine that ignores abort leaves its
#: groups generating; they are then cancelled and keep the tokens read last.
STOP_GRACE_S = 30.0


def keep_partial(entry: Entry, partial: object, num_generations: int) -> None:
    """Keep the tokens an engine handed back for ``entry``, if they fit the group."""
    if not isinstance(partial, GroupResult):
        return
    problem = partial.problem(start_weight=entry.start_weight, num_generations=num_generations,
                              finished=False)
    if problem is None:
        entry.partial = partial
    else:
        log.warning("group %s: the engine's tokens so far are not kept (%s)",
                    entry.group_id, problem)


def continue_from(entry: Entry, partial: object, num_generations: int) -> None:
    """A group whose engine left the fleet mid-attempt: its next attempt continues
    the tokens it had there (``entry.prefix``), exactly as a resumed checkpoint
    continues a group; counted in ``groups_continued`` when it commits. Tokens
    that do not fit the group are dropped (it continues from its old prefix)."""
    keep_partial(entry, partial, num_generations)
    if entry.partial is not None:
        entry.prefix, entry.partial = entry.partial, None


def _generating(entries: Iterable[Entry]) -> dict[int, list[Entry]]:
    """Entries whose attempt runs on an engine now, by engine."""
    by_engine: dict[int, list[Entry]] = collections.defaultdict(list)
    for entry in entries:
        if entry.state is EntryState.GENERATING and entry.engine is not None:
            by_engine[entry.engine].append(entry)
    return by_engine


async def read_partials(entries: Iterable[Entry], engines: Sequence[RolloutEngine],
                        capabilities: Sequence[EngineCapabilities], num_generations: int) -> None:
    """Before a checkpoint: the tokens every generating group has so far, from
    engines that can tell, without stopping the groups. A group whose attempt
    changed meanwhile keeps what it had."""
    for idx, group in _generating(entries).items():
        if not capabilities[idx].snapshot:
            continue
        attempts = {e.group_id: e.attempts for e in group}
        got = await engines[idx].snapshot(list(attempts)) or {}  # type: ignore[attr-defined]
        for entry in group:
            partial = got.get(entry.group_id)
            if (partial is not None and entry.attempts == attempts[entry.group_id]
                    and entry.state is EntryState.GENERATING):
                keep_partial(entry, partial, num_generations)


async def stop_generating(entries: Iterable[Entry], engines: Sequence[RolloutEngine],
                          capabilities: Sequence[EngineCapabilities]) -> None:
    """A graceful stop: abort every generating group so that its engine hands back
    the tokens it has, and wait (at most :data:`STOP_GRACE_S`) until the groups'
    tasks have taken them."""
    waiting = []
    for idx, group in _generating(entries).items():
        for entry in group:
            entry.stopping = True
        tasks = [e.task for e in group if e.task is not None]
        if capabilities[idx].abort:
            await engines[idx].abort([e.group_id for e in group])  # type: ignore[attr-defined]
        else:  # nothing to hand back: the groups keep the tokens read last
            for task in tasks:
                task.cancel()
        waiting.extend(tasks)
    if waiting:
        await asyncio.wait(waiting, timeout=STOP_GRACE_S)
