"""The memory of a training step: measured per step, and counted exactly.

``train/peak_memory_bytes`` (:class:`StepPeakMemory`), the peak of one step:

* CUDA: the caching allocator's peak (``torch.cuda.max_memory_allocated``),
  reset when the step's first chunk starts: every tensor the step held at once,
  model state included.
* CPU: the process's peak resident set *growth* during the step: the kernel's
  high-water mark (``VmHWM``) is reset when the step starts (``/proc/self/clear_refs``)
  and the resident size then is subtracted. It counts everything the process
  touched meanwhile (a local engine in the same process too), and the allocator's
  own caching. Linux only; elsewhere the metric is left out.
"""

from __future__ import annotations

import re
import threading
import weakref
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int | None:
    try:
        match = re.search(rf"^{field}:\s+(\d+) kB", _STATUS.read_text(), re.M)
    except OSError:
        return None
    return int(match.group(1)) if match else None


class StepPeakMemory:
    """Measures the peak of each step on ``device``: :meth:`start` at the step's
    first chunk (again is a no-op), :meth:`stop` when it finishes."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._baseline: int | None = None
        self._running = False

    def start(self) -> None:
        if self._running:
            return
        self._running = True
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            _CLEAR_REFS.write_text("5")  # resets VmHWM to the current RSS
        except OSError:
            self._baseline = None
            return
        self._baseline = _status_kib("VmRSS")

    def stop(self) -> float | None:
        """Bytes (see the module docstring), or None when not measurable here."""
        if not self._running:
            return None
        self._running = False
        if self.device.type == "cuda":
            return float(torch.cuda.max_memory_allocated(self.device))
        if self._baseline is None:
            return None
        peak = _status_kib("VmHWM")
        return None if peak is None else float(max(peak - self._baseline, 0) * 1024)


class LiveTensorBytes(TorchDispatchMode):
    """Counts the bytes of the tensors a computation allocates and the peak of
    those alive at once: a deterministic measure of a step's memory, independent
    of the allocator, the machine's load and the values computed.

    Every operator's outputs are counted once per storage and uncounted when the
    storage is freed; tensors that existed before the mode was entered are not
    counted (the peak is the growth over them). Allocations inside one operator's
    kernel (scratch space) are not seen. It is what ``torch.cuda.max_memory_allocated``
    measures on a GPU, less the allocator's rounding.

    With tensors on the ``meta`` device nothing is computed, so a real model's
    step is measured in seconds on any machine. Two things a real device does
    are imitated there: host reads of a meta tensor (``.item()``, ``.tolist()``,
    ``.cpu()``) read zeros - and ``True`` for a boolean, the common answer of
    data-dependent checks such as transformers' "no packed sequences"; and
    attention runs the CPU's flash kernel (linear memory in the sequence
    length), which torch would otherwise replace on meta tensors by its math
    path (quadratic).
    """

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}  # storage -> bytes
        # Frees may come from autograd's device threads, or from a garbage collection
        # run inside the bookkeeping itself (reentrant).
        self._lock = threading.RLock()
        self.current = 0
        self.peak = 0
        self._sdpa: Any = None

    def __enter__(self) -> LiveTensorBytes:
        self._sdpa = F.scaled_dot_product_attention
        F.scaled_dot_product_attention = _sdpa_like_cpu(self._sdpa)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        F.scaled_dot_product_attention = self._sdpa
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        host = _host_read_of_meta(func, args, kwargs)
        if host is not None:
            return host[0]
        out = func(*args, **kwargs)
        for t in _allocated(func, out):
            storage = t.untyped_storage()
            key = storage._cdata
            with self._lock:
                if key in self._live:
                    continue
                self._live[key] = storage.nbytes()
                self.current += storage.nbytes()
                self.peak = max(self.peak, self.current)
            # The storage's Python object lives exactly as long as the storage
            # (torch preserves it): its finalizer marks the free, when it happens.
            weakref.finalize(storage, self._freed, key).atexit = False
        return out

    def _freed(self, key: int) -> None:
        with self._lock:
            self.current -= self._live.pop(key, 0)


def _allocated(func: Any, out: Any) -> list[torch.Tensor]:
    """The outputs of ``func`` in new memory: not views of, nor written into, an input."""
    returns = func._schema.returns
    outs = out if isinstance(out, tuple) and len(returns) > 1 else (out,)
    fresh = []
    for ret, value in zip(returns, outs):
        if ret.alias_info is None:
            fresh.extend(t for t in tree_leaves(value) if isinstance(t, torch.Tensor))
    return fresh


def _host_read_of_meta(func: Any, args: Any, kwargs: Any) -> tuple[Any] | None:
    aten = torch.ops.aten
    src = args[0] if args and isinstance(args[0], torch.Tensor) else None
    if src is None or not src.is_meta:
        return None
    if func is aten._local_scalar_dense.default:
        return (True if src.dtype == torch.bool else 0.0 if src.is_floating_point() else 0,)
    device = kwargs.get("device")
    if func is aten._to_copy.default and device is not None and torch.device(device).type != "meta":
        return (torch.zeros(src.shape, dtype=kwargs.get("dtype") or src.dtype, device=device),)
    return None


def _sdpa_like_cpu(sdpa: Any) -> Any:
    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                  is_causal: bool = False, scale: float | None = None, **kwargs: Any) -> Any:
        if not query.is_meta:
            return sdpa(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                        is_causal=is_causal, scale=scale, **kwargs)
        # What SDPA runs on a CPU (grouped-query heads included).
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]

    return attention
