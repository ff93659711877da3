"""Where reward calls run: daemon threads, and processes that can be killed.

Both run under :class:`~asyncrl.tasks.rewards.RewardPool`, which bounds how
many calls run at once and times each one out on the event loop's clock.

* :class:`DaemonThreads` is a ``concurrent.futures.Executor`` (so the pool can
  use ``loop.run_in_executor``, which the virtual-time loops track) whose
  threads are daemons: a reward that hangs forever holds its thread forever,
  but cannot hang the interpreter at exit the way a ``ThreadPoolExecutor``
  (joined at exit) would. A new thread starts whenever no idle one is free, so
  an abandoned thread never blocks the calls after it.
* :class:`ProcessWorkers` keeps one process per concurrent call. A thread of
  the pool sends the call to an idle process and waits for the reply; on a
  timeout the pool kills that process (the waiting thread then sees the pipe
  close) and a fresh one is started for the next call.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from asyncrl.errors import ConfigError, RewardError, RewardWorkerLost
from asyncrl.tasks.rewards.functions import (
    close_worker_loop,
    describe_function,
    score_many,
    use_worker_loop,
)
from asyncrl.types import Prompt

_STOP = object()


class DaemonThreads(Executor):
    """An executor of daemon threads that grows whenever every thread is busy."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0  # threads waiting for a job that no submit has claimed yet
        self._threads: set[threading.Thread] = set()
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError(f"{self._name}: submit after shutdown")
            self._jobs.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1  # that thread takes this job
            else:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}",
                                          daemon=True)
                self._threads.add(thread)
                thread.start()
        return future

    def _work(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is _STOP:
                    return
                future, fn, args, kwargs = job
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(*args, **kwargs))
                    except BaseException as exc:
                        future.set_exception(exc)
                del job, future  # do not keep the last job's objects alive while idle
                with self._lock:
                    self._idle += 1
        finally:
            close_worker_loop()
            with self._lock:
                self._threads.discard(threading.current_thread())

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the threads once they finish their current job (a hung one never
        does; it is a daemon and dies with the interpreter). Never waits."""
        with self._lock:
            self._shutdown = True
            for _ in range(len(self._threads)):
                self._jobs.put(_STOP)

    @property
    def num_threads(self) -> int:
        return len(self._threads)


# ------------------------------------------------------------- processes
def _child_main(conn: Any, payload: bytes) -> None:
    """A reward worker process: load the reward, then score until told to stop."""
    # Ctrl-C is the parent's to handle; it stops its workers itself.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        reward = pickle.loads(payload)
    except Exception as exc:
        conn.send(("error", f"the reward could not be loaded in a worker process: "
                            f"{type(exc).__name__}: {exc}; make it importable there"))
        return
    conn.send(("ready", None))
    use_worker_loop()

    def mark() -> None:
        conn.send(("mark", None))

    while True:
        try:
            job = conn.recv()
        except (EOFError, OSError):
            return
        if job is None:
            return
        try:
            conn.send(("ok", score_many(reward, *job, mark)))
        except RewardError as exc:
            conn.send(("error", str(exc)))


class _Process:
    def __init__(self, ctx: Any, payload: bytes) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_child_main, args=(child, payload), daemon=True,
                                   name="asyncrl-reward")
        self.process.start()
        child.close()

    def wait_ready(self) -> None:
        try:
            status, text = self.conn.recv()
        except (EOFError, OSError):
            self.kill()
            raise RewardWorkerLost(
                f"a reward worker process exited while starting (exit code "
                f"{self.process.exitcode}); its error is printed above"
            ) from None
        if status != "ready":
            self.kill()
            raise RewardWorkerLost(text)

    def call(self, prompt: Prompt, completions: list[str], mark: Callable[[], None]) -> list[float]:
        """Score in the process; ``mark()`` each time it starts a reward call.
        Raises EOFError/OSError when the process dies (or is killed)."""
        self.conn.send((prompt, completions))
        while True:
            status, value = self.conn.recv()
            if status == "mark":
                mark()
            elif status == "error":
                raise RewardError(value)
            else:
                return value

    def signal_kill(self) -> None:
        """SIGKILL, without waiting: the thread blocked in :meth:`call` then sees
        the pipe close and cleans up (safe to call from the event loop)."""
        if self.process.is_alive():
            self.process.kill()

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)
        self.conn.close()

    def stop(self) -> None:
        with contextlib.suppress(OSError):  # already gone
            self.conn.send(None)
        self.process.join(2)
        self.kill()


class ProcessWorkers:
    """Reward worker processes (``spawn``: a fresh interpreter, safe next to
    threads and torch), started on demand and reused."""

    def __init__(self, reward: Callable[[Prompt, str], Any]) -> None:
        self.name = describe_function(reward)
        try:
            self._payload = pickle.dumps(reward)
        except Exception as exc:
            raise ConfigError(
                f"task.reward.executor: process sends the reward to worker processes, but "
                f"{self.name} cannot be pickled ({exc}); make it a module-level function or "
                "use executor: thread"
            ) from None
        self._ctx = multiprocessing.get_context("spawn")
        self._lock = threading.Lock()
        self._idle: list[_Process] = []
        self._all: set[_Process] = set()
        self._closed = False
        self.killed = 0

    def take(self) -> _Process:
        """An idle, ready process (a new one when none is idle). Called in a pool thread."""
        with self._lock:
            if self._closed:
                raise RewardWorkerLost("the reward pool is closed")
            if self._idle:
                return self._idle.pop()
        proc = _Process(self._ctx, self._payload)
        with self._lock:
            self._all.add(proc)
        proc.wait_ready()
        return proc

    def give_back(self, proc: _Process) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(proc)
                return
        proc.stop()

    def discard(self, proc: _Process, *, killed: bool = False) -> None:
        proc.kill()
        with self._lock:
            self._all.discard(proc)
            self.killed += killed

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, busy = self._idle, self._all - set(self._idle)
            self._idle, self._all = [], set()
        for proc in idle:
            proc.stop()
        for proc in busy:
            proc.kill()
