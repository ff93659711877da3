"""What the vLLM engine needs around vLLM itself: the engine arguments a policy
implies, the checks to run before starting it (how a sync hands over the weights
is :mod:`asyncrl.engines.vllm.transport`), the split of CPU cores
between vLLM and the trainer, and a reaper for vLLM's processes.

Everything that imports vLLM does so inside a function: importing this module
costs nothing, and a missing vLLM gives one line saying how to install it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from asyncrl.engines.vllm.output import quiet_import, verbose
from asyncrl.errors import ConfigError, require

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig

#: AsyncEngineArgs fields asyncrl sets itself, and where the user sets them instead
#: (None: fixed, because the engine's contract depends on the value).
OWNED_ARGS: dict[str, str | None] = {
    "model": "policy.model_name_or_path",
    "tokenizer": "policy.model_name_or_path",
    "dtype": "policy.vllm.dtype",
    "gpu_memory_utilization": "policy.vllm.gpu_memory_utilization",
    "max_model_len": "policy.vllm.max_model_len",
    "enforce_eager": "policy.vllm.enforce_eager",
    "tensor_parallel_size": "policy.vllm.tensor_parallel_size",
    "seed": "policy.vllm.seed",
    "max_num_seqs": "policy.generation.max_batch_sequences",
    # Behavior log-probs must be those of the distribution sampled from (after
    # temperature and top-p), as GroupResult promises.
    "logprobs_mode": None,
    # Sampling is what policy.generation says, never defaults read from the
    # model's generation_config.json (top_k, repetition_penalty, ...).
    "generation_config": None,
    "weight_transfer_config": None,
}


def require_vllm() -> Any:
    """The vllm module, or a MissingDependency saying how to install it.

    vLLM logs at INFO in every process it starts (over a hundred lines per
    start-up); a run's log gets its warnings and errors only, unless the user
    set ``VLLM_LOGGING_LEVEL`` (``asyncrl -v`` sets INFO). The variable is read
    when vllm is first imported, here, and inherited by its processes.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    with quiet_import():  # vLLM's import-time notes: with asyncrl -v only
        vllm = require("vllm", "vllm", "policy.engine: vllm")
        # What check_config and the engine use, imported here, quietly.
        for module in ("vllm.engine.arg_utils", "vllm.platforms"):
            importlib.import_module(module)
    return vllm


def engine_args(policy: PolicyConfig, model_dir: str | Path, *, seed: int,
                log_stats: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``vllm.AsyncEngineArgs`` for a policy: the ``policy.vllm``
    block, ``policy.vllm.engine_args`` passed through, and the fixed settings
    (``seed``: the engine's sampling seed, :class:`~asyncrl.engines.EngineOptions`).
    ``log_stats``: vLLM keeps its Prometheus stats (a server's ``/metrics``, which
    the ``vllm_server`` engine reads its load from); ``engine_args`` may say otherwise."""
    v = policy.vllm
    clash = sorted(set(v.engine_args) & set(OWNED_ARGS))
    if clash:
        key = clash[0]
        where = OWNED_ARGS[key]
        fix = f"set {where} instead" if where else "asyncrl sets it and it cannot be changed"
        raise ConfigError(f"policy.vllm.engine_args.{key}: {fix}")
    args: dict[str, Any] = {
        "disable_log_stats": not log_stats,
        # A progress bar per weight sync: vLLM's output with -v only.
        "use_tqdm_on_load": verbose(),
        **v.engine_args,
        "model": str(model_dir),
        "tokenizer": str(model_dir),
        "dtype": v.dtype,
        "gpu_memory_utilization": v.gpu_memory_utilization,
        "max_model_len": v.max_model_len,
        "enforce_eager": v.enforce_eager,
        "tensor_parallel_size": v.tensor_parallel_size,
        "seed": seed,
        "max_num_seqs": policy.generation.max_batch_sequences,
        "logprobs_mode": "processed_logprobs",
        "generation_config": "vllm",
    }
    return args


def check_engine_args(extra: Mapping[str, Any]) -> None:
    """Every key of ``policy.vllm.engine_args`` must be an AsyncEngineArgs field."""
    require_vllm()
    from vllm.engine.arg_utils import AsyncEngineArgs

    from asyncrl.config import suggest_key

    fields = [f.name for f in dataclasses.fields(AsyncEngineArgs)]
    for key in extra:
        if key not in fields:
            close = suggest_key(key, fields)
            hint = f" (did you mean {close!r}?)" if close else ""
            raise ConfigError(
                f"policy.vllm.engine_args.{key}: not an argument of vLLM's AsyncEngineArgs"
                f"{hint}; see `vllm serve --help` for the valid ones"
            )


def is_cpu_platform() -> bool:
    require_vllm()
    from vllm.platforms import current_platform

    return bool(current_platform.is_cpu())


def cpu_head_sizes() -> list[int]:
    """Head sizes vLLM's CPU attention kernels accept."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return list(CPUAttentionBackend.get_supported_head_sizes())


def head_dim(p: PolicyConfig) -> tuple[int, str]:
    """The policy's attention head size and where it comes from (for messages)."""
    if p.model_name_or_path is None:
        m = p.model
        return m.hidden_size // m.num_heads, (
            f"policy.model.hidden_size={m.hidden_size} / num_heads={m.num_heads}"
        )
    config_file = Path(p.model_name_or_path).expanduser() / "config.json"
    try:
        hf = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return 0, ""  # the model loader reports an unreadable model
    hf = hf.get("text_config", hf)
    dim = hf.get("head_dim") or hf.get("hidden_size", 0) // max(hf.get("num_attention_heads", 1), 1)
    return int(dim), f"the head_dim of {config_file}"


def check_config(policy: PolicyConfig) -> None:
    """Every check ``policy.engine: vllm`` needs before vLLM starts (vLLM installed,
    engine_args, a head size the platform's kernels accept); raise a ConfigError
    naming the fix. Imports vLLM (seconds) but starts nothing."""
    check_engine_args(policy.vllm.engine_args)
    if not is_cpu_platform():
        return
    dim, source = head_dim(policy)
    sizes = cpu_head_sizes()
    if dim and dim not in sizes:
        fix = "use a model whose heads have one of those sizes, or policy.engine: local"
        if policy.model_name_or_path is None:
            hidden = policy.model.hidden_size
            heads = [h for h in range(hidden, 0, -1) if hidden % h == 0 and hidden // h in sizes]
            if heads:
                fix = (f"set policy.model.num_heads={heads[0]} (head size {hidden // heads[0]}), "
                       "or policy.engine: local")
        raise ConfigError(
            f"policy.engine: {policy.engine} on CPU: {source} gives attention heads of size "
            f"{dim}, which "
            f"vLLM's CPU kernels do not support (they take {sizes}); {fix}"
        )


# ------------------------------------------------------------------ reaper
#: Run by a separate Python process: it waits until its stdin closes, then kills
#: the processes it was given - unless the owner said "released" first. So the
#: engine's processes die with this one even when it is SIGKILLed.
_REAPER = r"""
import sys
import psutil
procs = []
for pid in sys.argv[1:]:
    try:
        procs.append(psutil.Process(int(pid)))
    except psutil.Error:
        pass
if sys.stdin.buffer.read() != b"released":
    for p in procs:
        try:
            p.terminate()
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(procs, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
"""


#: Processes started by :func:`own_session`, kept referenced until multiprocessing
#: has reaped them (:func:`settle_spawned`): a collected Popen of a live process
#: would be reaped by subprocess, racing multiprocessing's own wait.
_SPAWNED: list[subprocess.Popen[bytes]] = []


def settle_spawned() -> None:
    """Let go of the processes of :func:`own_session` that have ended.

    multiprocessing waits for them, so their Popen never learns that they ended,
    and one collected so - at the latest when the interpreter exits - warns
    "subprocess N is still running" (ResourceWarning). ``active_children`` has
    multiprocessing reap those of its children that exited; a Popen whose process
    is then no child of this one any more is told so (poll finds no child to wait
    for: returncode 0) and dropped. A process still running stays."""
    import multiprocessing

    multiprocessing.active_children()
    for proc in list(_SPAWNED):
        if not _unreaped_child(proc.pid):
            proc.poll()
            _SPAWNED.remove(proc)


def _unreaped_child(pid: int) -> bool:
    """``pid`` is a child of this process that nobody has waited for yet (running,
    or ended and not reaped); WNOWAIT looks without reaping it. Without
    ``os.waitid`` (macOS before Python 3.13) every one counts as such: kept."""
    if not hasattr(os, "waitid"):
        return True
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


@functools.cache
def _settle_at_exit() -> None:
    """Settle once more when this process exits: as a multiprocessing finalizer
    with an exit priority below 0, it runs after multiprocessing has joined its
    children at exit (a plain atexit handler may run before that, while a child
    that just ended is not reaped yet) and before the interpreter's teardown
    collects the Popens."""
    from multiprocessing import util

    util.Finalize(None, settle_spawned, exitpriority=-1)


@contextlib.contextmanager
def own_session(output: IO[str] | None = None) -> Iterator[None]:
    """Meanwhile, processes that multiprocessing spawns start in a session (and
    process group) of their own.

    vLLM spawns its engine core this way (its worker inherits the session). A
    terminal's Ctrl-C then reaches the asyncrl process only, which stops the run
    gracefully - with a last weight sync and a checkpoint - and shuts vLLM down
    itself; otherwise vLLM would exit at once, under the run's feet.
    ``multiprocessing.util.spawnv_passfds`` has no option for it, hence this
    stand-in with the same contract (``passfds`` kept open). Their stdout and
    stderr: ``output`` (a file), or this process's when None.
    """
    from multiprocessing import resource_tracker, util

    # multiprocessing's resource tracker lives as long as this process (and ignores
    # SIGINT: a session of its own would change nothing). Started here, by
    # multiprocessing itself, it is no Popen of ours that still runs at exit.
    resource_tracker.ensure_running()
    _settle_at_exit()
    original = util.spawnv_passfds

    def spawn(path: str, args: list[str], passfds: Iterable[int]) -> int:
        proc = subprocess.Popen(args, executable=path, pass_fds=sorted(map(int, passfds)),
                                close_fds=True, restore_signals=False, start_new_session=True,
                                stdout=output, stderr=output)
        _SPAWNED.append(proc)
        return proc.pid

    util.spawnv_passfds = spawn
    try:
        yield
    finally:
        util.spawnv_passfds = original


def _threads(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _pin(pid: int, cores: set[int]) -> None:
    for tid in _threads(pid):
        with contextlib.suppress(OSError):  # a thread may end meanwhile
            os.sched_setaffinity(tid, cores)


def isolate_cores(vllm_pids: set[int]) -> set[int] | None:
    """Keep vLLM's processes on the cores vLLM bound its worker to, and this
    process on the others; returns this process's former cores (to give back
    with :func:`restore_cores`), or None when there is nothing to split.

    vLLM's CPU worker binds its threads to all cores of a NUMA node but one,
    which it leaves to the engine core and the frontend - which here is the
    process that also trains. The engine core busy-waits on the worker, so
    training there, or on the worker's core, makes the two slow each other down.
    """
    if not hasattr(os, "sched_getaffinity") or not vllm_pids:
        return None
    mine = os.sched_getaffinity(0)
    try:
        bound = min((os.sched_getaffinity(pid) for pid in vllm_pids), key=len)
    except OSError:
        return None
    rest = mine - bound
    if not rest or not bound < mine:
        return None
    for pid in vllm_pids:
        _pin(pid, bound)
    _pin(os.getpid(), rest)
    return mine


def restore_cores(cores: set[int]) -> None:
    _pin(os.getpid(), cores)


async def wait_exited(pids: set[int], timeout: float) -> None:
    """Wait until the processes ``pids`` have exited (or ``timeout``), without
    reaping them (Linux pidfds; elsewhere it returns at once)."""
    loop = asyncio.get_running_loop()
    waits: list[tuple[int, asyncio.Future[None]]] = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except (AttributeError, OSError):  # gone already, or no pidfds here
            continue
        done: asyncio.Future[None] = loop.create_future()
        loop.add_reader(fd, lambda f=done: f.done() or f.set_result(None))
        waits.append((fd, done))
    try:
        if waits:
            await asyncio.wait([f for _, f in waits], timeout=timeout)
    finally:
        for fd, _ in waits:
            loop.remove_reader(fd)
            os.close(fd)


def descendants() -> set[int]:
    """Pids of the live processes started by this one (children of children too),
    but for multiprocessing's resource tracker, which is shared and ends with us."""
    import psutil

    pids = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() == psutil.STATUS_ZOMBIE:
                continue
            if "multiprocessing.resource_tracker" in " ".join(proc.cmdline()):
                continue
        except psutil.Error:
            continue
        pids.add(proc.pid)
    return pids


class Reaper:
    """Kills ``pids`` if this process ends without calling :meth:`release`.

    vLLM's engine-core and worker processes outlive a parent that is killed
    (SIGKILL, the OOM killer, a Ray worker being replaced); this watcher, in its
    own session so that a terminal's Ctrl-C does not stop it first, notices the
    end of this process because the pipe to it closes.
    """

    def __init__(self, pids: set[int]) -> None:
        self.pids = set(pids)
        self._proc: subprocess.Popen[bytes] | None = None
        if self.pids:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _REAPER, *map(str, sorted(self.pids))],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            )

    def release(self) -> None:
        """The processes were shut down properly: stop watching them."""
        proc, self._proc = self._proc, None
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.write(b"released")
        with contextlib.suppress(OSError):
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)

    def reap(self) -> None:
        """Kill the processes now (e.g. after a failed shutdown)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
