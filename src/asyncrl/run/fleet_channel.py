"""The control channel of a running job: ``asyncrl fleet RUN_DIR ...`` (docs/fleet.md).

A run listens on a Unix socket for as long as it holds the run directory's lock
(:mod:`asyncrl.run.lock`): no network port, and only processes that may open
the run directory reach it. The socket is ``RUN_DIR/.asyncrl.fleet.sock`` when
that path fits a socket address (107 bytes on Linux), else a private temporary
directory's; ``RUN_DIR/.asyncrl.fleet`` names it either way.

The protocol is one JSON object per line each way: a request
(``{"op": "status"}``, ``{"op": "add", "url": ...}``, ``{"op": "remove", "url":
..., "abort": bool, "deadline_s": float | null}``, ``{"op": "scale", "size":
N}``) and its answer (``{"ok": true, "lines": [...]}`` or ``{"ok": false,
"error": "..."}``), after any number of progress lines (``{"progress": "..."}``:
what the command waits for, as :func:`asyncrl.engines.fleet.tell` says it). The
run waits on connections (``asyncio.start_unix_server``): nothing polls. A
command the run's end cuts short is answered that the run stopped.

The client checks the lock first, so a run that is not running is told as such
(a socket file a killed run left behind is not mistaken for a live run).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

from asyncrl.engines.fleet import progress
from asyncrl.errors import AsyncRLError, FleetError
from asyncrl.run.lock import live_holder

log = logging.getLogger("asyncrl.run")

SOCKET_FILE = ".asyncrl.fleet.sock"
POINTER_FILE = ".asyncrl.fleet"
#: Longest socket path Linux takes (sun_path is 108 bytes with its NUL).
MAX_SOCKET_PATH = 107
#: Longest request or answer line.
MAX_LINE = 1 << 20
#: Seconds the run's end waits for the answers it owes to be sent.
CLOSE_WAIT_S = 5.0
#: The answer to a command the run's end cut short.
STOPPED = {"ok": False, "error": "the run stopped before it finished the command (its log "
                                  "says what was done); resume it to change its fleet"}

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


@contextlib.asynccontextmanager
async def fleet_channel(run_dir: str | Path, handle: Handler) -> AsyncIterator[Path | None]:
    """Serve fleet commands with ``handle`` meanwhile (call it while holding the
    run's lock). Yields the socket's path (None: no socket could be made, which
    is logged; the run goes on); on exit the socket, its pointer and any command
    still being carried out are gone."""
    run_dir = Path(run_dir)
    path, private = _socket_path(run_dir)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a run that was killed: the lock says we own the directory
    busy: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        busy.add(asyncio.current_task())  # type: ignore[arg-type]
        # This connection's command only: each task runs in a context of its own.
        progress.set(lambda line: writer.write(_encode({"progress": line})))
        # The run's end cancels this task; it ends normally all the same: the
        # client is owed an answer, and asyncio (3.11) logs a connection handler
        # that ends cancelled as "Exception in callback ... CancelledError".
        try:
            try:
                answer = await _answer(await reader.readline(), handle)
            except asyncio.CancelledError:
                answer = STOPPED
            writer.write(_encode(answer))
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away; nothing to tell
        except asyncio.CancelledError:
            pass  # the answer's send cut short (a client that reads nothing)
        finally:
            busy.discard(asyncio.current_task())  # type: ignore[arg-type]
            writer.close()

    try:
        server = await asyncio.start_unix_server(serve, path=str(path), limit=MAX_LINE)
    except OSError as exc:
        if private is None:  # a filesystem without sockets: a private directory may have them
            private = Path(tempfile.mkdtemp(prefix="asyncrl-fleet-"))
            path = private / "s"
        try:
            server = await asyncio.start_unix_server(serve, path=str(path), limit=MAX_LINE)
        except OSError:
            shutil.rmtree(private, ignore_errors=True)
            # The run goes on; only its fleet cannot be changed.
            log.warning("asyncrl fleet is unavailable for this run: no Unix socket could be "
                        "made (%s)", exc)
            yield None
            return
    pointer = run_dir / POINTER_FILE
    pointer.write_text(f"{path}\n")
    try:
        yield path
    finally:
        server.close()
        for attempt in range(2):  # the commands, then any send of their answers left
            for task in list(busy):
                task.cancel()
            if busy:
                await asyncio.wait(list(busy), timeout=CLOSE_WAIT_S if attempt == 0 else None)
        with contextlib.suppress(OSError):
            pointer.unlink()
        with contextlib.suppress(OSError):
            path.unlink()
        if private is not None:
            shutil.rmtree(private, ignore_errors=True)


async def _answer(line: bytes, handle: Handler) -> dict[str, Any]:
    try:
        request = json.loads(line)
        if not isinstance(request, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return {"ok": False, "error": f"not a fleet request ({exc})"}
    try:
        return await handle(request)
    except AsyncRLError as exc:  # FleetError and friends: the message says what to do
        return {"ok": False, "error": str(exc)}
    except Exception as exc:  # the run goes on; the client hears why
        log.exception("fleet command %r failed", request.get("op"))
        return {"ok": False, "error": f"the run could not carry out {request.get('op')!r}: "
                                      f"{type(exc).__name__}: {exc}"}


def _encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message).encode() + b"\n"


def _socket_path(run_dir: Path) -> tuple[Path, Path | None]:
    path = run_dir.resolve() / SOCKET_FILE
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH:
        return path, None
    private = Path(tempfile.mkdtemp(prefix="asyncrl-fleet-"))
    return private / "s", private


def request(run_dir: str | Path, message: dict[str, Any],
            on_progress: Callable[[str], None] | None = None) -> list[str]:
    """Send one command to the run in ``run_dir`` and return its answer's lines;
    ``on_progress`` is called with each progress line as it comes. FleetError: no
    run is running there, or the run refused the command."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FleetError(f"{run_dir} is not a run directory (no such directory)")
    pid = live_holder(run_dir)
    if pid is None:
        raise FleetError(f"no run is running in {run_dir} (no process holds its lock); "
                         "asyncrl fleet talks to a running job: start or resume it first")
    try:
        address = (run_dir / POINTER_FILE).read_text().strip()
    except OSError:
        raise FleetError(f"the run in {run_dir} (pid {pid}) is not listening for fleet "
                         "commands yet (it is starting, or ending); try again in a moment") from None
    answer = _exchange(address, message, pid, on_progress or (lambda line: None))
    if not answer.get("ok"):
        raise FleetError(str(answer.get("error", "the run refused the command")))
    return [str(line) for line in answer.get("lines", ())]


def _exchange(address: str, message: dict[str, Any], pid: int,
              on_progress: Callable[[str], None]) -> dict[str, Any]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(address)
        except OSError as exc:
            raise FleetError(f"cannot reach the run (pid {pid}) at {address}: {exc}; it may "
                             "be ending") from None
        sock.sendall(_encode(message))
        with sock.makefile("rb") as reader:
            while True:
                line = reader.readline(MAX_LINE)
                if not line:
                    raise FleetError(f"the run (pid {pid}) closed the channel without an "
                                     "answer; it may be ending")
                answer = json.loads(line)
                if "progress" not in answer:
                    return answer
                on_progress(str(answer["progress"]))


__all__ = ["POINTER_FILE", "SOCKET_FILE", "fleet_channel", "request"]
