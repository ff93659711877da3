"""The trainer's ranks as processes on this machine, started by asyncrl itself.

No ``torchrun``: :class:`ProcessRanks` starts ``world_size`` processes, each
serving a :class:`~asyncrl.trainers.distributed.rank_core.RankCore` over a pipe.

* **Start-up.** Processes come from a ``forkserver`` that has imported torch and
  transformers once: the first rank of a run pays for the imports, every later
  start (more ranks, a later run in the same process) does not. Rank 0's
  rendezvous is a free local TCP port.
* **Calls.** One command at a time, in the same order on every rank; a reader
  thread per rank turns its answers into futures. Messages are plain pickles
  (tensors inline: never torch's shared-memory handles, which cost a file
  descriptor per tensor). The full weights travel in one message per tensor,
  received straight into the tensor's memory (one copy, never a pickle of the
  whole state dict).
* **Lifetime.** Each rank runs in a session of its own and ignores SIGINT: a
  terminal's Ctrl-C reaches only the controller, which stops the run
  gracefully (last checkpoint included) and then the ranks. Each rank also
  watches a pipe the controller never writes to: when the controller dies,
  however it dies, the pipe closes and the rank exits at once, even in the
  middle of a collective. So no rank outlives its run.
"""

from __future__ import annotations

import contextlib
import faulthandler
import multiprocessing
import os
import pickle
import signal
import threading
import traceback
from collections import deque
from collections.abc import Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any

from asyncrl.trainers.distributed.rank_core import RankSpec, WeightStream
from asyncrl.trainers.distributed.rank_protocol import RankDied, RankFailed, exit_detail

#: Imported once by the forkserver, so that rank processes start without importing them.
PRELOAD = ["torch", "transformers", "asyncrl.policy.build", "asyncrl.tasks",
           "asyncrl.trainers.distributed.processes", "asyncrl.trainers.distributed.checkpoint"]


#: How long a rank may take to reach the rendezvous store.
STORE_TIMEOUT_S = 600.0


def _context() -> Any:
    if "forkserver" in multiprocessing.get_all_start_methods():
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return multiprocessing.get_context("spawn")


# ------------------------------------------------------------- messages
def _send(conn: Connection, message: Any) -> None:
    conn.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _recv(conn: Connection) -> Any:
    return pickle.loads(conn.recv_bytes())


# ------------------------------------------------------------- rank side
def _rank_main(rank: int, spec: RankSpec, conn: Connection, lifeline: Connection) -> None:
    """A rank process: set up, then serve commands until ``close`` or EOF."""
    _detach(lifeline)
    try:
        from asyncrl.trainers.distributed.rank_core import RankCore

        core = RankCore(spec, rank)
    except BaseException as exc:
        _send(conn, ("error", _describe(exc)))
        return
    _send(conn, ("ok", core.info()))
    serve(core, conn)


def serve(core: Any, conn: Connection) -> None:
    while True:
        try:
            method, args = _recv(conn)
        except (EOFError, OSError):
            return
        try:
            result = getattr(core, method)(*args)
            if isinstance(result, WeightStream):
                _send_stream(conn, result, send=core.rank == 0)
                result = None
            _send(conn, ("ok", result))
        except BaseException as exc:
            _send(conn, ("error", _describe(exc)))
        if method == "close":
            return


def _detach(lifeline: Connection) -> None:
    os.setsid()  # signals to the controller's process group do not reach the ranks
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # `kill -USR1 <pid>` prints where a rank is (e.g. which collective it waits in).
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()
        os._exit(70)  # the controller is gone: nobody will ever ask for this rank's work

    threading.Thread(target=watch, name="asyncrl-rank-lifeline", daemon=True).start()


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception_only(type(exc), exc)
    return lines[-1].strip() if lines else type(exc).__name__


def _send_stream(conn: Connection, stream: WeightStream, *, send: bool) -> None:
    if send:
        _send(conn, ("stream", stream.header))
    for tensor in stream.tensors:  # every rank runs the gathers; rank 0 sends
        if send and tensor is not None:
            _send(conn, ("tensor", None))
            conn.send_bytes(tensor.contiguous().reshape(-1).view(_uint8()).numpy())


def _uint8() -> Any:
    import torch

    return torch.uint8


# ------------------------------------------------------- controller side
def _receive_stream(conn: Connection, header: list) -> dict[str, Any]:
    import torch

    weights: dict[str, Any] = {}
    names = [name for name, *_ in header]
    for name, dtype, shape, alias in header:
        if alias is not None:
            weights[name] = weights[names[alias]]
            continue
        kind, payload = _recv(conn)
        if kind != "tensor":
            raise RankFailed(0, payload)
        tensor = torch.empty(shape, dtype=getattr(torch, dtype))
        conn.recv_bytes_into(tensor.reshape(-1).view(torch.uint8).numpy())
        weights[name] = tensor
    return weights


class ProcessRanks:
    """:class:`~asyncrl.trainers.distributed.rank_protocol.Ranks` as local processes."""

    def __init__(self, spec_of: Any, world_size: int) -> None:
        """``spec_of(init_method) -> RankSpec``; the ranks are starting when this returns."""
        import datetime

        import torch.distributed as dist

        ctx = _context()
        self.world_size = world_size
        # The rendezvous store lives here, up before any rank starts.
        self._store = dist.TCPStore("127.0.0.1", 0, world_size, is_master=True,
                                    wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
        spec = spec_of(f"tcp://127.0.0.1:{self._store.port}")
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        self._lifelines: list[Connection] = []
        self._pending: list[deque[Future[Any]]] = [deque() for _ in range(world_size)]
        self._dead: list[RankDied | None] = [None] * world_size
        self._lock = threading.Lock()
        self.started = [Future() for _ in range(world_size)]
        try:
            for rank in range(world_size):
                ours, theirs = ctx.Pipe()
                life_theirs, life_ours = ctx.Pipe(duplex=False)
                proc = ctx.Process(target=_rank_main, args=(rank, spec, theirs, life_theirs),
                                   name=f"asyncrl-trainer-rank{rank}", daemon=True)
                self._pending[rank].append(self.started[rank])
                proc.start()
                theirs.close()
                life_theirs.close()
                self.procs.append(proc)
                self.conns.append(ours)
                self._lifelines.append(life_ours)
        except BaseException:
            self.kill()
            raise
        for rank in range(world_size):
            threading.Thread(target=self._read, args=(rank,), daemon=True,
                             name=f"asyncrl-rank{rank}-reader").start()

    # ------------------------------------------------------------ protocol
    def submit(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[Future[Any]]:
        futures: list[Future[Any]] = []
        with self._lock:
            for rank, conn in enumerate(self.conns):
                future: Future[Any] = Future()
                futures.append(future)
                dead = self._dead[rank]
                if dead is not None:
                    future.set_exception(dead)
                    continue
                self._pending[rank].append(future)
                with contextlib.suppress(OSError):  # a dead rank: its reader fails the future
                    _send(conn, (method, args[rank]))
        return futures

    def describe(self, rank: int) -> str:
        proc = self.procs[rank]
        return f"rank {rank} (pid {proc.pid})"

    def engine_weights(self, result: Any) -> Any:
        return result

    def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.kill()
        for proc in self.procs:
            with contextlib.suppress(Exception):
                proc.join(timeout=10)

    def close(self, timeout: float) -> None:
        from concurrent.futures import wait

        if any(p.is_alive() for p in self.procs):
            wait(self.submit("close", [()] * self.world_size), timeout=timeout)
        for proc in self.procs:
            proc.join(timeout=timeout)
        self.kill()  # whatever did not exit by now
        for conn in (*self.conns, *self._lifelines):
            conn.close()

    # ------------------------------------------------------------ readers
    def _read(self, rank: int) -> None:
        conn = self.conns[rank]
        while True:
            try:
                kind, payload = _recv(conn)
                if kind == "stream":
                    payload = _receive_stream(conn, payload)
                    kind, _ = _recv(conn)
            except RankFailed as exc:  # the rank failed in the middle of the weights
                self._resolve(rank, exc)
                continue
            except (EOFError, OSError):
                break
            self._resolve(rank, payload if kind == "ok" else RankFailed(rank, payload))
        proc = self.procs[rank]
        proc.join(timeout=10)
        with self._lock:
            self._dead[rank] = dead = RankDied(rank, exit_detail(proc.exitcode))
            pending, self._pending[rank] = list(self._pending[rank]), deque()
        for future in pending:
            if not future.cancelled():
                future.set_exception(dead)

    def _resolve(self, rank: int, outcome: Any) -> None:
        with self._lock:
            future = self._pending[rank].popleft()
        if future.cancelled():
            return
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


def start_local_ranks(spec_of: Any, world_size: int, startup_timeout_s: float) -> ProcessRanks:
    """Start the ranks and wait until every one has built its shards (or one failed)."""
    from concurrent.futures import FIRST_EXCEPTION, wait

    ranks = ProcessRanks(spec_of, world_size)
    done, pending = wait(ranks.started, timeout=startup_timeout_s, return_when=FIRST_EXCEPTION)
    errors = [f.exception() for f in done if f.exception() is not None]
    if errors or pending:
        ranks.kill()
        from asyncrl.errors import SetupError

        reason = (str(errors[0]) if errors else
                  f"ranks {[ranks.started.index(f) for f in pending]} did not start within "
                  f"{startup_timeout_s:g}s")
        raise SetupError(f"the sharded trainer could not start its {world_size} ranks: {reason}")
    return ranks


__all__ = ["ProcessRanks", "serve", "start_local_ranks"]
