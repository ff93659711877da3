"""The reward pool: rewards scored off the event loop, each call with a timeout.

:class:`RewardPool` implements :class:`~asyncrl.tasks.base.Scorer`. A prompt group
is one job for one worker (a thread, or a process with ``executor: process``),
which calls the task's reward once per completion, one after the other (an
``async def`` reward's calls run concurrently); ``num_workers`` groups are
scored at once. One job per group, not per completion, keeps the pool's
overhead per group near that of a single hand-off between threads.

**Timeouts** run on the event loop's clock and apply to every call: the clock
restarts when the worker begins the next call, and waiting for a free worker
does not count. A call that passes ``timeout_s`` fails its group with
:class:`~asyncrl.errors.RewardTimeout` at once, and:

* in a **process** the process is killed and a new one starts for the next call;
* in a **thread** nothing can stop it (Python has no way to kill a thread). The
  thread is abandoned and keeps running until the function returns, if it ever
  does; its result is dropped. The pool starts new threads so the other calls
  are not held up, but while ``num_workers`` abandoned calls are still running
  every new call fails at once, saying to use ``executor: process``: leaking
  threads without bound would only hide the problem.

Under the virtual-time jump loop (``run_virtual(loop="jump")``) the clock does
not wait for worker threads while a timer is pending, so a call with a timeout
reaches it at once; that loop suits tests of hangs. looptime (the default of
``run_virtual``) advances with real time while a worker runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Literal

from asyncrl.config.dataset import RewardPoolConfig
from asyncrl.errors import RewardError, RewardTimeout, RewardWorkerLost
from asyncrl.tasks.rewards.functions import describe_function, score_many
from asyncrl.tasks.rewards.workers import DaemonThreads, ProcessWorkers
from asyncrl.types import Prompt, prompt_label

log = logging.getLogger("asyncrl.rewards")

Reward = Callable[[Prompt, str], Any]
_QUEUED, _RUNNING, _DONE, _EXPIRED, _CANCELLED = "queued", "running", "done", "expired", "cancelled"


class _Call:
    """One job (a group's reward calls), seen from both sides: its worker thread
    moves it from queued to running to done; the event loop may expire it
    (timeout) or cancel it (the caller gave up) - whichever comes first wins,
    under ``lock``."""

    def __init__(self, pool: RewardPool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.loop = loop
        self.lock = threading.Lock()
        self.state = _QUEUED
        self.worker: Any = None  # the process running it (process executor)
        self.timer: asyncio.TimerHandle | None = None
        #: Loop time at which the reward call now running started (set by the worker).
        self.started_at = 0.0
        self.result: asyncio.Future[list[float]] = loop.create_future()

    # ---- worker thread side
    def begin(self, worker: Any = None) -> bool:
        with self.lock:
            if self.state != _QUEUED:
                return False
            self.state, self.worker = _RUNNING, worker
        self.mark()
        if self.pool.timeout_s is not None:
            # RuntimeError: the loop closed meanwhile, and nobody waits for this call.
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self._arm)
        return True

    def mark(self) -> None:
        """A reward call starts now: its timeout counts from here."""
        self.started_at = self.loop.time()

    def end(self) -> bool:
        """The call returned; False when it had expired first (its result is dropped)."""
        with self.lock:
            finished = self.state == _RUNNING
            if finished:
                self.state = _DONE
            self.worker = None
        return finished

    # ---- event loop side
    def cancel(self) -> None:
        with self.lock:
            if self.state == _QUEUED:
                self.state = _CANCELLED

    def _arm(self) -> None:
        if self.state == _RUNNING:
            self.timer = self.loop.call_at(self.started_at + self.pool.timeout_s, self._expire)

    def _expire(self) -> None:
        deadline = self.started_at + self.pool.timeout_s
        # A later call of the job started since the timer was set: wait for its
        # own deadline (a shortfall under a millisecond is not worth a timer).
        if self.state == _RUNNING and self.loop.time() < deadline - 1e-3:
            self.timer = self.loop.call_at(deadline, self._expire)
            return
        with self.lock:
            if self.state != _RUNNING:
                return
            self.state, worker = _EXPIRED, self.worker
        self.pool._expired(worker)
        if not self.result.done():
            self.result.set_exception(RewardTimeout(
                f"{self.pool.name} timed out: a call ran longer than "
                f"task.reward.timeout_s={self.pool.timeout_s:g}s"))

    def worker_done(self, future: asyncio.Future[Any]) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if future.cancelled():
            self.pool._finished(expired=self.state == _EXPIRED)
            self.result.cancel()
            return
        exc = future.exception()
        self.pool._finished(expired=self.state == _EXPIRED)
        if self.result.done() or self.state in (_EXPIRED, _CANCELLED):
            return
        if exc is None:
            self.result.set_result(future.result())
        else:
            # The worker functions raise RewardError subclasses for what the reward
            # did; anything else is a bug of the pool and is passed on as it is.
            self.result.set_exception(exc)


class RewardPool:
    """Scores completions with ``reward(prompt, completion) -> float`` in workers.

    ``reward`` has the shape of ``Task.reward`` (plain or ``async def``);
    ``prepare`` (optional, cheap, run on the event loop) turns the controller's
    prompt into the one the reward gets, e.g. a dataset attaching its record.
    """

    def __init__(
        self,
        reward: Reward,
        *,
        num_workers: int = 4,
        executor: Literal["thread", "process"] = "thread",
        timeout_s: float | None = 30.0,
        prepare: Callable[[Prompt], Prompt] | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers={num_workers}: need at least 1")
        self.reward = reward
        self.name = describe_function(reward)
        self.num_workers = num_workers
        self.executor = executor
        self.timeout_s = timeout_s
        self._prepare = prepare
        self._threads = DaemonThreads("asyncrl-reward")
        self._processes = ProcessWorkers(reward) if executor == "process" else None
        self._slots: asyncio.Semaphore | None = None
        self._closed = False
        #: Jobs that timed out and whose thread still runs (thread executor).
        self.hung = 0
        self._warned_hung = False
        self.groups = 0
        self.timeouts = 0

    @classmethod
    def from_config(cls, reward: Reward, cfg: RewardPoolConfig, *,
                    prepare: Callable[[Prompt], Prompt] | None = None) -> RewardPool:
        return cls(reward, num_workers=cfg.num_workers, executor=cfg.executor,
                   timeout_s=cfg.timeout_s, prepare=prepare)

    async def score(self, prompt: Prompt, completions: Sequence[str]) -> list[float]:
        """One reward per completion. The reward raising or returning a non-number
        raises :class:`RewardError` (data); a timeout :class:`RewardTimeout` and a
        dead worker process :class:`RewardWorkerLost` (infra). Each names the
        prompt, the completion and the error."""
        if self._closed:
            raise RewardWorkerLost("the reward pool is closed")
        if self.hung >= self.num_workers:
            raise RewardTimeout(
                # No count that changes from call to call: the same refusal of
                # many groups is then one failure (the controller groups them).
                f"every worker of {self.name} (task.reward.num_workers={self.num_workers}) "
                "is held by a call that timed out and threads cannot be stopped; set "
                "task.reward.executor: process so that hung calls are killed, or fix what "
                "makes the reward hang"
            )
        scored = self._prepare(prompt) if self._prepare is not None else prompt
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.num_workers)
        await self._slots.acquire()
        loop = asyncio.get_running_loop()
        call = _Call(self, loop)
        run = self._run_in_process if self._processes is not None else self._run_in_thread
        try:
            job = loop.run_in_executor(self._threads, run, call, scored, list(completions))
        except BaseException:
            self._slots.release()
            raise
        job.add_done_callback(call.worker_done)
        self.groups += 1
        try:
            return await call.result
        except RewardError as exc:  # the same class: infra or data is the raiser's call
            raise type(exc)(f"{prompt_label(prompt)}: {exc}") from exc
        except asyncio.CancelledError:
            call.cancel()
            raise

    # ---- worker threads
    def _run_in_thread(self, call: _Call, prompt: Prompt, completions: list[str]) -> Any:
        if not call.begin():
            return None
        try:
            return score_many(self.reward, prompt, completions, call.mark)
        finally:
            call.end()

    def _run_in_process(self, call: _Call, prompt: Prompt, completions: list[str]) -> Any:
        workers = self._processes
        assert workers is not None
        proc = workers.take()
        if not call.begin(proc):
            workers.give_back(proc)
            return None
        try:
            values = proc.call(prompt, completions, call.mark)
        except (EOFError, OSError):
            if not call.end():  # killed on its timeout; the loop already reported it
                workers.discard(proc, killed=True)
                return None
            workers.discard(proc)
            raise RewardWorkerLost(
                f"{self.name}: its worker process died (exit code {proc.process.exitcode}) "
                "while scoring; a new one takes the next group"
            ) from None
        except RewardError:
            self._release(call, proc)
            raise
        self._release(call, proc)
        return values

    def _release(self, call: _Call, proc: Any) -> None:
        if call.end():
            self._processes.give_back(proc)
        else:  # it expired just as the reply came, and was killed
            self._processes.discard(proc, killed=True)

    # ---- event loop bookkeeping
    def _expired(self, worker: Any) -> None:
        self.timeouts += 1
        assert self._slots is not None
        self._slots.release()  # the caller gave up: its slot goes to the next call
        if worker is not None:
            worker.signal_kill()
        else:
            self.hung += 1
            # Once per pool: each timeout fails its group, which the controller
            # reports; the count is in the error once num_workers are abandoned.
            level = logging.DEBUG if self._warned_hung else logging.WARNING
            self._warned_hung = True
            log.log(level, "%s ran past task.reward.timeout_s=%gs; its thread cannot be stopped "
                    "and is abandoned (%d abandoned now)", self.name, self.timeout_s, self.hung)

    def _finished(self, *, expired: bool) -> None:
        if not expired:
            assert self._slots is not None
            self._slots.release()
        elif self._processes is None:
            self.hung -= 1

    async def close(self) -> None:
        """Stop the workers: idle processes exit, busy ones are killed; idle
        threads exit, abandoned (hung) ones are left to the interpreter."""
        if self._closed:
            return
        self._closed = True
        self._threads.shutdown(wait=False)
        if self._processes is not None:
            await asyncio.to_thread(self._processes.close)
