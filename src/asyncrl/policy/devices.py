"""Devices, dtypes, worker threads and CUDA streams of the in-process engine and trainer.

The same code runs on a CPU and on a GPU; everything CUDA-specific here turns
into a no-op elsewhere:

* :func:`policy_dtype` resolves ``policy.dtype`` (``auto``: float32 on CPU,
  bfloat16 on a CUDA device that supports it).
* :func:`worker_executor` gives the engine and the trainer one worker thread
  each, and on CUDA a stream of its own for that thread. Work on the legacy
  default stream waits for every other stream (and they for it), so two
  workers on the default stream would serialise; on streams of their own,
  generation overlaps with training on one GPU.
* :class:`HostCopy` moves device tensors to the host without blocking the
  thread that asks: the decode loop reads what the GPU produced once the copy
  has landed instead of waiting for it at every token.
* :func:`hand_over` / :func:`adopt` pass tensors made on one worker's stream
  to the other (the trainer's weights to the engine) safely.
"""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import torch

from asyncrl.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


def check_device(device: str, field: str = "policy.device") -> torch.device:
    """``device`` as a torch device, or a :class:`ConfigError` naming ``field`` and
    the fix when it is not one or this machine does not have it."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(
            f"{field}={device!r} is not a torch device; use cpu, cuda, cuda:N or mps"
        ) from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            build = ("this torch is a CPU-only build" if torch.version.cuda is None
                     else "no CUDA GPU is visible (CUDA_VISIBLE_DEVICES? driver?)")
            raise ConfigError(
                f"{field}={device!r} but CUDA is not available here: {build} (torch "
                f"{torch.__version__}). Set {field}=cpu, or run on a machine with a GPU and "
                "a CUDA build of torch"
            )
        count = torch.cuda.device_count()
        if dev.index is not None and dev.index >= count:
            raise ConfigError(
                f"{field}={device!r} but this machine has {count} CUDA device(s) "
                f"(cuda:0..cuda:{count - 1}); pick one of them"
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"{field}={device!r} but MPS (Apple GPU) is not available here; set {field}=cpu")
    elif dev.type not in ("cpu", "cuda", "mps"):
        try:  # any other backend torch knows: it works if a tensor can live there
            torch.empty(1, device=dev)
        except Exception as exc:
            raise ConfigError(
                f"{field}={device!r} cannot be used here ({exc}); set {field}=cpu or cuda"
            ) from None
    return dev


def policy_dtype(name: str, device: str | torch.device) -> torch.dtype:
    """The torch dtype of ``policy.dtype`` on ``device``.

    ``auto`` is float32 on CPU (CPU matmuls gain little from bf16 and exact
    engine/trainer agreement is worth more) and bfloat16 on CUDA devices with
    bf16 support (Ampere and newer; float32 on older ones: float16 needs loss
    scaling and is opt-in).
    """
    if name != "auto":
        return DTYPES[name]
    if is_cuda(device) and torch.cuda.is_available() and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def worker_executor(
    name: str, num_threads: int | None, device: torch.device
) -> tuple[ThreadPoolExecutor, torch.cuda.Stream | None]:
    """A one-thread executor for a worker (engine or trainer) and, on CUDA, the
    stream every kernel that thread launches goes to (None elsewhere)."""
    stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    def init_thread() -> None:
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        if stream is not None:
            # Current device and stream are per thread: this one launches on its
            # own stream of its own device (events included).
            torch.cuda.set_device(stream.device)
            torch.cuda.set_stream(stream)

    executor = ThreadPoolExecutor(1, thread_name_prefix=f"asyncrl-{name}", initializer=init_thread)
    return executor, stream


def hand_over(tensors: Iterable[torch.Tensor]) -> None:
    """Called by the thread that made ``tensors`` before another thread uses them:
    waits until the kernels that wrote them on this thread's stream are done
    (a no-op for CPU tensors)."""
    devices = {t.device for t in tensors if t.device.type == "cuda"}
    for device in devices:
        torch.cuda.current_stream(device).synchronize()


def adopt(tensors: Iterable[torch.Tensor]) -> None:
    """Called by the receiving thread after it enqueued its reads of ``tensors``:
    their memory (allocated on the sender's stream) is not reused by the caching
    allocator before this thread's stream has finished reading it."""
    for t in tensors:
        if t.device.type == "cuda":
            t.record_stream(torch.cuda.current_stream(t.device))


class HostCopy:
    """Device tensors on their way to the host.

    On CUDA: a non-blocking copy into pinned memory on the current stream, and an
    event recorded after it; :meth:`ready` asks the event without waiting. On the
    CPU the tensors are used as they are (ready at once), so callers must not
    write to them afterwards: the decode loop only ever replaces its state
    tensors, or copies out of them with an indexing op that makes new ones.
    """

    def __init__(self, *tensors: torch.Tensor) -> None:
        self._event: torch.cuda.Event | None = None
        if tensors and tensors[0].device.type == "cuda":
            self.host = tuple(
                torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
                for t in tensors
            )
            self._event = torch.cuda.Event()
            # After the copies, on the stream that made them (the source device's).
            self._event.record(torch.cuda.current_stream(tensors[0].device))
        else:
            self.host = tuple(t.to("cpu") for t in tensors)

    def ready(self) -> bool:
        return self._event is None or self._event.query()

    def wait(self) -> tuple[torch.Tensor, ...]:
        """The host tensors, waiting for the copy if it has not landed yet."""
        if self._event is not None:
            self._event.synchronize()
        return self.host
