"""A closed output pipe never stops a run.

``asyncrl train ... | head``, a ``tee`` or a log collector that dies: every
later write to that pipe fails with EPIPE (``BrokenPipeError``: Python ignores
SIGPIPE), and a progress line or a log record would then end the run with an
error. But a run's results are its files, not its terminal output. So for the
life of the ``asyncrl`` command, :func:`guard_output` wraps ``sys.stdout`` and
``sys.stderr``: at the first broken pipe the stream's file descriptor is pointed
at ``/dev/null`` (``os.dup2``: C-level writers and Python's flush at exit go
there too), and everything goes on - metrics, checkpoints and ``summary.json``
are written as always.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


def _is_broken_pipe(exc: OSError) -> bool:
    return isinstance(exc, BrokenPipeError) or exc.errno == errno.EPIPE


class PipeSafeStream:
    """``stream`` (a text stream) with writes that survive its pipe closing.

    Everything but writing and flushing is the wrapped stream's (``isatty``,
    ``fileno``, ``encoding``, ...), so rich, logging and ``print`` see it as usual.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        #: True once the pipe closed: what is written from then on goes nowhere.
        self.broken = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except OSError as exc:
                if not _is_broken_pipe(exc):
                    raise
                self._to_devnull()
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if self.broken:
            return
        try:
            self._stream.flush()
        except OSError as exc:
            if not _is_broken_pipe(exc):
                raise
            self._to_devnull()

    def _to_devnull(self) -> None:
        self.broken = True
        try:
            fd = self._stream.fileno()
        except (OSError, ValueError, AttributeError):
            return  # not a file descriptor (a test's capture): writes are dropped here
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()  # what was buffered for the pipe goes to /dev/null


@contextlib.contextmanager
def guard_output() -> Iterator[None]:
    """Meanwhile, ``sys.stdout`` and ``sys.stderr`` survive a closed pipe; at the
    end they are flushed (so that Python's own flush at exit finds nothing to
    fail on) and put back."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PipeSafeStream(saved[0]), PipeSafeStream(saved[1])  # type: ignore[assignment]
    try:
        yield
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        sys.stdout, sys.stderr = saved


__all__ = ["PipeSafeStream", "guard_output"]
