"""The ledger: every prompt group's life, and the balance that proves none was lost.

States: ``inflight`` and ``ready`` are live (a group in either is *pending* at a
checkpoint or at shutdown, and ``ledger.jsonl`` writes its line at the end of a
run with ``state: pending``: :meth:`JsonlHistory.append_pending`); ``trained``,
``evicted``, ``aborted``, ``failed`` and ``filtered`` (its rewards carried no
signal for ``grpo.dynamic_sampling``; it never reached the buffer) are terminal.
A group enters exactly one terminal state at most once; the ledger raises on a
second transition, because that would be a double count.

Memory and checkpoints grow with the *live* groups only: a group that reaches
a terminal state is handed to the ledger's :class:`LedgerHistory` (a JSONL file
in a run directory, a list in tests, nothing in the simulator) and only counted
from then on.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any, Protocol

from asyncrl.errors import LedgerError
from asyncrl.types import GroupId

LIVE = ("inflight", "ready")
#: A record's fields set only when an attempt fails (:meth:`Ledger.attempt_failed`).
_FAILURE_NOTES = frozenset({"last_error", "last_error_kind", "source"})
#: The state ``ledger.jsonl`` gives a group still live when the run stopped.
PENDING = "pending"
TERMINAL = ("trained", "evicted", "aborted", "failed", "filtered")
STATES = LIVE + TERMINAL


class GroupRecord:
    __slots__ = (
        "attempts",
        "dispatch_time",
        "end_step",
        "end_weight",
        "error",
        "failure",
        "filter_reason",
        "finish_time",
        "gen_end",
        "gen_start",
        "group_id",
        "last_error",
        "last_error_kind",
        "prompt_id",
        "source",
        "staleness",
        "start_weight",
        "state",
        "target_step",
        "tokens",
        "tokens_longest",
    )

    def __init__(
        self,
        group_id: GroupId,
        prompt_id: int,
        target_step: int | None,
        start_weight: int,
        dispatch_time: float,
    ) -> None:
        self.group_id = group_id
        self.prompt_id = prompt_id
        self.target_step = target_step
        self.start_weight = start_weight
        self.dispatch_time = dispatch_time
        self.attempts = 0
        self.state = "inflight"
        self.end_weight: int | None = None
        self.finish_time: float | None = None
        self.end_step: int | None = None  # trainer version when trained or evicted
        self.staleness: int | None = None
        self.error: str | None = None  # why the last attempt failed (failed groups)
        self.failure: str | None = None  # the budget a failed group used up: infra or data
        self.filter_reason: str | None = None  # why grpo.dynamic_sampling filtered it
        # last_error (why its last failed attempt failed: any group, pending ones
        # included, so a group a stop put back says why it is still pending),
        # last_error_kind (infra, data or bug) and source (where its prompt came
        # from, a dataset task's file and line) are set by attempt_failed only:
        # left unset here, they cost the groups that never fail nothing (this runs
        # once per group, on the simulator's hot path); unset, they read as None.
        # The generation that finished it (for ``asyncrl simulate --calibrate``):
        # when it ran, its completions' tokens in all and of the longest one.
        self.gen_start: float | None = None
        self.gen_end: float | None = None
        self.tokens: int | None = None
        self.tokens_longest: int | None = None

    def __getattr__(self, name: str) -> Any:
        """Reached only for a slot never set: a failure note of a group that never
        failed reads as None (see ``__init__``)."""
        if name in _FAILURE_NOTES:
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupRecord:
        rec = cls.__new__(cls)
        for name in cls.__slots__:
            setattr(rec, name, data.get(name))
        return rec


class LedgerHistory(Protocol):
    """Where records of finished groups go."""

    def append(self, record: GroupRecord) -> None:
        """Called once per group, when it reaches a terminal state (a run
        directory's file also gets a line per group still pending at the end of
        the run: :meth:`JsonlHistory.append_pending`)."""
        ...

    def position(self) -> int:
        """Called when a checkpoint is taken: a marker that :meth:`truncate` can go
        back to on resume (records after it were written by a run that died)."""
        ...

    def truncate(self, position: int) -> None:
        """Called on resume, before the run: forget what came after ``position``."""
        ...


class MemoryHistory:
    """Keeps finished records in a list (tests, library users who want them)."""

    def __init__(self) -> None:
        self.records: list[GroupRecord] = []

    def append(self, record: GroupRecord) -> None:
        self.records.append(record)

    def position(self) -> int:
        return len(self.records)

    def truncate(self, position: int) -> None:
        del self.records[position:]


class JsonlHistory:
    """Appends one JSON line per finished group to a file (``RUN_DIR/ledger.jsonl``).

    The position is the file's size in bytes: a resume cuts the file back to
    what it held at the checkpoint, so no group is recorded twice.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fh = self.path.open("a", encoding="utf-8")

    def append(self, record: GroupRecord) -> None:
        self._fh.write(json.dumps(record.to_dict(), default=str) + "\n")

    def append_pending(self, record: GroupRecord) -> None:
        """The line of a group still live when the run stopped: ``state`` is
        ``pending`` (neither in flight nor ready any more: the run is over, and a
        resume takes it up again), ``stopped_in`` the live state it stopped in."""
        line = {**record.to_dict(), "state": PENDING, "stopped_in": record.state}
        self._fh.write(json.dumps(line, default=str) + "\n")

    def position(self) -> int:
        self._fh.flush()
        return self._fh.tell()

    def truncate(self, position: int) -> None:
        self._fh.flush()
        self._fh.truncate(min(position, self._fh.tell()))
        self._fh.seek(0, 2)

    def close(self) -> None:
        self._fh.close()


class Ledger:
    def __init__(self, history: LedgerHistory | None = None) -> None:
        self.history = history
        self._live: dict[GroupId, GroupRecord] = {}
        self._counts: Counter[str] = Counter()
        #: Failed groups by the budget they used up (they are in ``failed`` too).
        self._failed_kinds: Counter[str] = Counter()

    # ------------------------------------------------------------ transitions
    def dispatch(
        self,
        group_id: GroupId,
        *,
        prompt_id: int,
        target_step: int | None,
        start_weight: int,
        time: float,
    ) -> GroupRecord:
        if group_id in self._live:
            raise LedgerError(f"group {group_id!r} dispatched twice")
        rec = GroupRecord(group_id, prompt_id, target_step, start_weight, time)
        self._live[group_id] = rec
        self._counts["inflight"] += 1
        return rec

    def _move(self, group_id: GroupId, new: str, allowed: tuple[str, ...],
              rec: GroupRecord | None = None) -> GroupRecord:
        """``rec``: the group's live record, if the caller looked it up already."""
        if rec is None:
            rec = self._live.get(group_id)
        if rec is None:
            raise LedgerError(
                f"group {group_id!r} is not a live group of the ledger; a group ends in "
                "exactly one state"
            )
        if rec.state not in allowed:
            raise LedgerError(
                f"group {group_id!r} cannot move from {rec.state!r} to {new!r}; "
                "a group ends in exactly one state"
            )
        self._counts[rec.state] -= 1
        self._counts[new] += 1
        rec.state = new
        if new in TERMINAL:
            del self._live[group_id]
            if self.history is not None:
                self.history.append(rec)
        return rec

    def committed(self, group_id: GroupId, *, end_weight: int, attempts: int, time: float) -> None:
        rec = self._move(group_id, "ready", ("inflight",))
        rec.end_weight, rec.attempts, rec.finish_time = end_weight, attempts, time

    def generated(self, group_id: GroupId, *, start: float, end: float, tokens: int,
                  longest: int) -> None:
        """The attempt that generated the group's tokens ran from ``start`` to ``end``
        (a group aborted meanwhile is no longer live: nothing to note)."""
        rec = self._live.get(group_id)
        if rec is not None:
            rec.gen_start, rec.gen_end, rec.tokens, rec.tokens_longest = start, end, tokens, longest

    def trained(self, group_id: GroupId, *, step: int, staleness: int) -> None:
        rec = self._live.get(group_id)
        if rec is not None:
            rec.end_step, rec.staleness = step, staleness
        self._move(group_id, "trained", ("ready",), rec)

    def evicted(self, group_id: GroupId, *, step: int) -> None:
        rec = self._live.get(group_id)
        if rec is not None:
            rec.end_step = step
        self._move(group_id, "evicted", ("ready",), rec)

    def aborted(self, group_id: GroupId, *, attempts: int, time: float) -> None:
        self._end_inflight(group_id, "aborted", attempts, time, None)

    def failed(self, group_id: GroupId, *, attempts: int, time: float, error: str = "",
               kind: str | None = None) -> None:
        """``kind``: the budget the group used up (``infra`` or ``data``)."""
        rec = self._live.get(group_id)
        if rec is not None:
            rec.failure = kind
        self._end_inflight(group_id, "failed", attempts, time, error or None)
        if kind is not None:
            self._failed_kinds[kind] += 1

    def filtered(self, group_id: GroupId, *, attempts: int, time: float, end_weight: int,
                 reason: str) -> None:
        """The group finished, but ``grpo.dynamic_sampling``'s filter rejected it
        (``reason``) before it was committed: it never held a ready slot."""
        rec = self._live.get(group_id)
        if rec is not None:
            rec.filter_reason, rec.end_weight = reason, end_weight
        self._end_inflight(group_id, "filtered", attempts, time, None)

    def _end_inflight(
        self, group_id: GroupId, state: str, attempts: int, time: float, error: str | None
    ) -> None:
        rec = self._live.get(group_id)
        if rec is not None:  # fill in before _move hands the record to the history
            rec.attempts, rec.finish_time, rec.error = attempts, time, error
        self._move(group_id, state, ("inflight",), rec)

    def attempt_failed(self, group_id: GroupId, *, error: str, kind: str,
                       source: str | None = None) -> None:
        """An attempt of the live group failed (``kind``: infra, data or bug); its
        record keeps the last such error, and ``source``, where its prompt came from."""
        rec = self._live.get(group_id)
        if rec is not None:
            rec.last_error, rec.last_error_kind = error, kind
            if source is not None:
                rec.source = source

    def set_attempts(self, group_id: GroupId, attempts: int) -> None:
        self._live[group_id].attempts = attempts

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        """Number of groups ever dispatched."""
        return sum(self._counts.values())

    def __getitem__(self, group_id: GroupId) -> GroupRecord:
        """A live group's record, or a finished one the history keeps in memory."""
        rec = self._live.get(group_id)
        if rec is not None:
            return rec
        for old in getattr(self.history, "records", ()):
            if old.group_id == group_id:
                return old
        raise KeyError(group_id)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._live

    def records(self) -> list[GroupRecord]:
        """Every record the ledger can still show: the finished ones its history
        keeps in memory (a :class:`MemoryHistory`; none for a file), then the live ones."""
        return [*getattr(self.history, "records", ()), *self._live.values()]

    def live_records(self) -> list[GroupRecord]:
        return list(self._live.values())

    def live_ids(self) -> set[GroupId]:
        return set(self._live)

    def counts(self) -> dict[str, int]:
        """``dispatched`` and one count per end state (``pending`` = live groups)."""
        c = self._counts
        return {
            "dispatched": len(self),
            "trained": c["trained"],
            "evicted": c["evicted"],
            "aborted": c["aborted"],
            "failed": c["failed"],
            "failed_infra": self._failed_kinds["infra"],
            "failed_data": self._failed_kinds["data"],
            "filtered": c["filtered"],
            "pending": c["inflight"] + c["ready"],
        }

    def check_balance(self, holder_ids: set[GroupId]) -> tuple[bool, str]:
        """True when every group is in exactly one state and the live ones are
        exactly the groups the holders name (the buffer, the step being trained,
        the queue's resumed groups: ``Controller._holder_ids``)."""
        problems = []
        recount = Counter(r.state for r in self._live.values())
        if any(recount[s] != self._counts[s] for s in LIVE):
            problems.append(f"live state counters drifted: {dict(recount)} vs {dict(self._counts)}")
        if any(self._counts[s] < 0 for s in STATES):
            problems.append(f"negative state counter: {dict(self._counts)}")
        live = set(self._live)
        if live != holder_ids:
            lost = sorted(map(str, live - holder_ids))[:5]
            extra = sorted(map(str, holder_ids - live))[:5]
            problems.append(f"live groups not in the buffer: {lost}; buffer groups not live: {extra}")
        return (not problems, "; ".join(problems))

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Live records and the counts: the size of a checkpoint does not grow
        with the length of the run."""
        return {
            "format": 2,
            "live": [r.to_dict() for r in self._live.values()],
            "counts": {s: self._counts[s] for s in TERMINAL},
            "failed_kinds": dict(self._failed_kinds),
            "history_position": self.history.position() if self.history is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != 2:
            raise LedgerError("ledger state of an older asyncrl (format 1); start a new run")
        self._live = {}
        self._counts = Counter({s: int(n) for s, n in state["counts"].items()})
        self._failed_kinds = Counter({k: int(n) for k, n in state.get("failed_kinds", {}).items()})
        for data in state["live"]:
            rec = GroupRecord.from_dict(data)
            if rec.state not in LIVE:
                raise LedgerError(f"ledger state has a live group in state {rec.state!r}")
            self._live[rec.group_id] = rec
            self._counts[rec.state] += 1
        position = state.get("history_position")
        if self.history is not None and position is not None:
            self.history.truncate(int(position))
