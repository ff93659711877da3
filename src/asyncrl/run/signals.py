"""SIGINT and SIGTERM during a run: stop gracefully, and quickly on a second one.

The first signal asks the controller to stop at its next safe point (between
two trainer calls): nothing more is dispatched, a step it had begun is
abandoned with its groups kept, and the run then writes a checkpoint, the
final weights, the summary and the plots, and prints how to resume. A second
signal cancels the run at once: the newest complete checkpoint stays as it was
(checkpoints are written to a temporary directory and renamed into place).

Outside the event loop (building the model, writing the summary) SIGTERM is
turned into the same ``KeyboardInterrupt`` as Ctrl-C, so a job scheduler's
SIGTERM never kills the process without a word. The signals stay handled until
the process exits: the ``asyncrl`` command holds :func:`sigterm_as_interrupt`
for its whole life, and :meth:`GracefulStop.uninstall` gives the previous
handlers back (asyncio alone would leave SIGTERM to the default action, which
kills the process, e.g. while vLLM shuts down after the run).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Coroutine, Iterator
from typing import Any

from asyncrl.types import StopReason

#: The signals a run handles, with the stop reason each gives and its exit code.
STOP_SIGNALS = {
    signal.SIGINT: (StopReason.INTERRUPTED, 130),
    signal.SIGTERM: (StopReason.TERMINATED, 143),
}
EXIT_CODES = dict(STOP_SIGNALS.values())


class Terminated(KeyboardInterrupt):
    """SIGTERM outside the event loop: handled like Ctrl-C, exit code 143."""


class GracefulStop:
    """Installed on the running loop for the duration of ``controller.run()``."""

    def __init__(self, controller: Any, task: asyncio.Task[Any]) -> None:
        self.controller = controller
        self.task = task
        self.received: list[signal.Signals] = []
        self._previous: dict[signal.Signals, Any] = {}

    @property
    def reason(self) -> StopReason | None:
        """``interrupted`` / ``terminated`` after the first signal, else None."""
        return STOP_SIGNALS[self.received[0]][0] if self.received else None

    @property
    def forced(self) -> bool:
        return len(self.received) > 1

    def install(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop handles the signals from here on. A signal that lands while
        this installs meets the handler from before (Ctrl-C's KeyboardInterrupt):
        nothing is left installed, and it is raised here - handled once, as a
        signal outside the loop, never also by the loop."""
        try:
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.getsignal(sig)
                loop.add_signal_handler(sig, self._on_signal, sig)
        except BaseException:
            # add_signal_handler has pointed the wakeup fd at the loop: the signal's
            # byte waits there, and reaches no handler once they are removed.
            self.uninstall(loop)
            raise

    def uninstall(self, loop: asyncio.AbstractEventLoop) -> None:
        """Back to the handlers from before :meth:`install` (asyncio's own removal
        would leave SIGTERM to the default action: death without a word). Safe to
        call twice, and after a partial install."""
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)
            previous = self._previous.pop(sig, None)
            if previous is not None:  # None: not installed from Python
                signal.signal(sig, previous)

    def _on_signal(self, sig: signal.Signals) -> None:
        self.received.append(sig)
        name = signal.Signals(sig).name
        if len(self.received) == 1:
            reason = STOP_SIGNALS[sig][0]
            self.controller.request_stop(
                reason, f"{name} received: stopped at the next safe point, state saved")
            print(f"\nasyncrl: {name} received; stopping after the current trainer call and "
                  f"saving a checkpoint ({name} again to stop at once)", file=sys.stderr)
        else:
            print(f"\nasyncrl: {name} received again; stopping now (the newest complete "
                  "checkpoint is kept)", file=sys.stderr)
            self.task.cancel()


def run_event_loop(main: Coroutine[Any, Any, Any]) -> Any:
    """``asyncio.run(main)``, without the runner's own SIGINT handler.

    asyncio.run puts in place a handler that cancels the main task, and it stays
    the Python-level handler until :meth:`GracefulStop.install` swaps in the
    loop's. A SIGINT inside ``loop.add_signal_handler`` - after it points the
    wakeup fd at the loop, before it swaps that handler - then reached both: a
    graceful stop *and* a cancel wherever the run next awaited, which could leave
    groups unaccounted (CI, stop 48). With the interpreter's own handler there
    instead, such a signal is one KeyboardInterrupt out of ``install``.
    """
    with asyncio.Runner() as runner:
        return runner.get_loop().run_until_complete(main)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """While a run is set up or wrapped up (no event loop handles signals),
    SIGTERM raises KeyboardInterrupt like Ctrl-C does; the previous handler
    comes back afterwards. A no-op off the main thread."""
    def raise_interrupt(signum: int, frame: Any) -> None:
        raise Terminated(f"{signal.Signals(signum).name} received")

    try:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:  # not the main thread: signals are not ours to handle
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
