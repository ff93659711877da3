"""One run at a time in a run directory: an exclusive lock for the life of a run.

Two runs writing one directory interleave their metrics, ledgers and
checkpoints (and ``--overwrite`` would delete a running run's files under it).
So :func:`asyncrl.run.train.train` - a new run, ``--overwrite`` and ``--resume``
alike - holds ``RUN_DIR/.asyncrl.lock`` from just before its first write until
it returns.

The lock is ``fcntl.flock`` on that file: the kernel releases it when the
holding process ends, however it ends (a SIGKILL or the OOM killer too), so a
lock is never stale - the next run simply takes it over. The file holds the
holder's pid, which a refused run names. The file itself stays (deleting a
lock file races with a process about to lock it); it is not part of the run.
Processes the run starts never hold the lock: the file is opened close-on-exec
and asyncrl starts its helper processes with ``spawn``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from asyncrl.errors import ConfigError

LOCK_FILE = ".asyncrl.lock"


class RunDirInUse(ConfigError):
    """Another process holds the run directory's lock."""


def holder_pid(run_dir: str | Path) -> int | None:
    """The pid written in ``run_dir``'s lock file (None when there is none)."""
    try:
        return int((Path(run_dir) / LOCK_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def live_holder(run_dir: str | Path) -> int | None:
    """The pid of the live process holding ``run_dir``'s lock (None: no process
    holds it; a lock file a dead run left behind does not count).

    It asks the kernel with a shared lock taken and released at once: a run
    starting in that same instant would be refused as if the directory were in
    use, and say so; nothing else can come of it.
    """
    try:
        fd = os.open(Path(run_dir) / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # no lock file: no run ever held it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        pid = holder_pid(run_dir)
        return pid if pid is not None else -1
    else:
        return None
    finally:
        os.close(fd)  # releases the shared lock, if taken


def _in_use(path: Path, pid: int | None) -> RunDirInUse:
    who = f"pid {pid}" if pid is not None else "a process that is just starting"
    return RunDirInUse(
        f"{path} is in use by another asyncrl run ({who}): two runs in one directory "
        "would mix their checkpoints, metrics and ledgers. Wait for it to end (or stop "
        "it), or pick another --run-dir"
    )


def refuse_if_in_use(run_dir: str | Path) -> None:
    """Raise :func:`run_dir_lock`'s error now when another process holds
    ``run_dir``: for a command that says what it will do there before it takes
    the lock (``--resume``), so that it never announces what it cannot do."""
    pid = live_holder(run_dir)
    if pid is not None and pid != os.getpid():
        raise _in_use(Path(run_dir), pid if pid > 0 else None)


@contextlib.contextmanager
def run_dir_lock(run_dir: str | Path) -> Iterator[Path]:
    """Hold ``run_dir``'s lock meanwhile (the directory is created if needed);
    raise :class:`RunDirInUse`, naming the holder's pid, when another process
    holds it."""
    path = Path(run_dir)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise _in_use(path, holder_pid(path)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield path
    finally:
        os.close(fd)  # releases the lock


__all__ = ["LOCK_FILE", "RunDirInUse", "holder_pid", "live_holder", "refuse_if_in_use",
           "run_dir_lock"]
