"""Background tasks of backends, supervised by the run that uses them.

An engine or a Ray proxy sometimes needs a task that nobody awaits (the local
engine's decoding scheduler, a worker restart). Started with :func:`spawn`,
such a task belongs to the :class:`Supervisor` of the run that is active where
it starts (a context variable the controller sets for the length of
``Controller.run``, inherited by every task the run creates): if it ends with
an error, the run hears of it and stops (``Controller.run`` reports every such
error, not only the first). Outside a run (a script driving an engine by
hand) the failure is logged at ERROR instead of vanishing with the task.

A task its creator awaits needs none of this: the error reaches the creator.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("asyncrl.supervision")

T = TypeVar("T")
OnFailure = Callable[[BaseException, str], None]


class Supervisor:
    """Holds the background tasks started under it; ``on_failure(error, name)`` is
    called (on the event loop) for each one that ends with an error."""

    def __init__(self, on_failure: OnFailure) -> None:
        self.on_failure = on_failure
        #: Strong references: the event loop keeps only weak ones to tasks.
        self.tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        return task

    def _ended(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            self.on_failure(error, task.get_name())


def _log_failure(error: BaseException, name: str) -> None:
    log.error("background task %s failed outside a run: %r", name, error)


_FALLBACK = Supervisor(_log_failure)
_current: contextvars.ContextVar[Supervisor] = contextvars.ContextVar(
    "asyncrl_supervisor", default=_FALLBACK)


def current() -> Supervisor:
    """The supervisor of the run active here (the logging fallback outside one)."""
    return _current.get()


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start ``coro`` as a background task under :func:`current`'s supervisor."""
    return current().spawn(coro, name=name)


def install(supervisor: Supervisor) -> contextvars.Token[Supervisor]:
    """Make ``supervisor`` the current one (the controller does, for its run)."""
    return _current.set(supervisor)


def uninstall(token: contextvars.Token[Supervisor]) -> None:
    _current.reset(token)


__all__ = ["Supervisor", "current", "install", "spawn", "uninstall"]
