"""How the controller reaches the trainer's ranks: the :class:`Ranks` protocol,
and what a failed call reports.

Two implementations: rank processes on this machine
(:class:`~asyncrl.trainers.distributed.processes.ProcessRanks`) and Ray actors
in a placement group (:class:`asyncrl.cluster.ray_ranks.RayRanks`). Both answer
every call with one ``concurrent.futures.Future`` per rank, so a caller can
wait on the event loop (``asyncio.wrap_future``) or in a thread alike, and the
event loop never blocks on a collective.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any, Protocol


class RankFailed(Exception):
    """A rank raised while running a call (its traceback's last line is ``detail``)."""

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"rank {rank}: {detail}")
        self.rank, self.detail = rank, detail


class RankDied(Exception):
    """A rank's process (or actor) ended while a call was pending or being sent."""

    def __init__(self, rank: int, detail: str) -> None:
        super().__init__(f"rank {rank}: {detail}")
        self.rank, self.detail = rank, detail


def exit_detail(exitcode: int | None) -> str:
    """How a process ended, in words (``multiprocessing``'s exit code)."""
    if exitcode is None:
        return "its connection closed but it has not exited"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


class Ranks(Protocol):
    """The trainer's ranks, as the controller-side trainer drives them."""

    world_size: int

    def submit(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Future[Any]]:
        """Called for every trainer call: run ``RankCore.<method>(*args[rank])``
        on every rank (in the same order on all of them) and return one future per
        rank, failed with :class:`RankFailed` or :class:`RankDied` as it happens."""
        ...

    def describe(self, rank: int) -> str:
        """Called when an error names a rank: ``"rank 1 (pid 123 on host)"``."""
        ...

    def engine_weights(self, result: Any) -> Any:
        """Called on rank 0's result of ``weights``: what the engines' ``update_weights`` take."""
        ...

    def kill(self) -> None:
        """Called when a rank failed: end every rank at once (any thread)."""
        ...

    def close(self, timeout: float) -> None:
        """Called once at the end of a run: stop the ranks cleanly (within
        ``timeout`` seconds, else kill them); no process is left behind."""
        ...


__all__ = ["RankDied", "RankFailed", "Ranks", "exit_detail"]
