"""The ledger: every prompt group's life, and the balance that proves none was lost.

States: ``inflight`` and ``ready`` are live (a group in either is *pending* at a
checkpoint or at shutdown); ``trained``, ``evicted``, ``aborted`` and ``failed``
are terminal. A group enters exactly one terminal state at most once; the
ledger raises on a second transition, because that would be a double count.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from asyncrl.errors import LedgerError
from asyncrl.types import GroupId

LIVE = ("inflight", "ready")
TERMINAL = ("trained", "evicted", "aborted", "failed")
STATES = LIVE + TERMINAL


class GroupRecord:
    __slots__ = (
        "attempts",
        "dispatch_time",
        "end_step",
        "end_weight",
        "finish_time",
        "group_id",
        "prompt_id",
        "staleness",
        "start_weight",
        "state",
        "target_step",
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

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GroupRecord:
        rec = cls.__new__(cls)
        for name in cls.__slots__:
            setattr(rec, name, data.get(name))
        return rec


class Ledger:
    def __init__(self) -> None:
        self._records: dict[GroupId, GroupRecord] = {}
        self._counts: Counter[str] = Counter()

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
        if group_id in self._records:
            raise LedgerError(f"group {group_id!r} dispatched twice")
        rec = GroupRecord(group_id, prompt_id, target_step, start_weight, time)
        self._records[group_id] = rec
        self._counts["inflight"] += 1
        return rec

    def _move(self, group_id: GroupId, new: str, allowed: tuple[str, ...]) -> GroupRecord:
        rec = self._records.get(group_id)
        if rec is None:
            raise LedgerError(f"group {group_id!r} is not in the ledger")
        if rec.state not in allowed:
            raise LedgerError(
                f"group {group_id!r} cannot move from {rec.state!r} to {new!r}; "
                "a group ends in exactly one state"
            )
        self._counts[rec.state] -= 1
        self._counts[new] += 1
        rec.state = new
        return rec

    def committed(self, group_id: GroupId, *, end_weight: int, attempts: int, time: float) -> None:
        rec = self._move(group_id, "ready", ("inflight",))
        rec.end_weight, rec.attempts, rec.finish_time = end_weight, attempts, time

    def trained(self, group_id: GroupId, *, step: int, staleness: int) -> None:
        rec = self._move(group_id, "trained", ("ready",))
        rec.end_step, rec.staleness = step, staleness

    def evicted(self, group_id: GroupId, *, step: int) -> None:
        rec = self._move(group_id, "evicted", ("ready",))
        rec.end_step = step

    def aborted(self, group_id: GroupId, *, attempts: int, time: float) -> None:
        rec = self._move(group_id, "aborted", ("inflight",))
        rec.attempts, rec.finish_time = attempts, time

    def failed(self, group_id: GroupId, *, attempts: int, time: float) -> None:
        rec = self._move(group_id, "failed", ("inflight",))
        rec.attempts, rec.finish_time = attempts, time

    def set_attempts(self, group_id: GroupId, attempts: int) -> None:
        self._records[group_id].attempts = attempts

    # ---------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self._records)

    def __getitem__(self, group_id: GroupId) -> GroupRecord:
        return self._records[group_id]

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._records

    def records(self) -> list[GroupRecord]:
        return list(self._records.values())

    def live_ids(self) -> set[GroupId]:
        return {gid for gid, r in self._records.items() if r.state in LIVE}

    def counts(self) -> dict[str, int]:
        """``dispatched`` and one count per end state (``pending`` = live groups)."""
        c = self._counts
        return {
            "dispatched": len(self._records),
            "trained": c["trained"],
            "evicted": c["evicted"],
            "aborted": c["aborted"],
            "failed": c["failed"],
            "pending": c["inflight"] + c["ready"],
        }

    def check_balance(self, buffer_ids: set[GroupId]) -> tuple[bool, str]:
        """True when every group is in exactly one state and the live ones are
        exactly the groups the buffer still holds (nothing lost, nothing extra)."""
        counts = self.counts()
        total = sum(v for k, v in counts.items() if k != "dispatched")
        recount = Counter(r.state for r in self._records.values())
        problems = []
        if total != counts["dispatched"]:
            problems.append(f"states sum to {total}, dispatched {counts['dispatched']}")
        if any(recount[s] != self._counts[s] for s in STATES):
            problems.append(f"state counters drifted: {dict(recount)} vs {dict(self._counts)}")
        live = self.live_ids()
        if live != buffer_ids:
            lost = sorted(map(str, live - buffer_ids))[:5]
            extra = sorted(map(str, buffer_ids - live))[:5]
            problems.append(f"live groups not in the buffer: {lost}; buffer groups not live: {extra}")
        return (not problems, "; ".join(problems))

    # ------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        return {"records": [r.to_dict() for r in self._records.values()]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._records = {}
        self._counts = Counter()
        for data in state["records"]:
            rec = GroupRecord.from_dict(data)
            if rec.state not in STATES:
                raise LedgerError(f"ledger state has unknown group state {rec.state!r}")
            self._records[rec.group_id] = rec
            self._counts[rec.state] += 1
