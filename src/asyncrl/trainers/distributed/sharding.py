"""Sharding a policy with FSDP2, and timing its collectives.

:func:`shard_model` wraps every decoder layer (the modules a transformers model
lists in ``_no_split_modules``) and then the whole model in ``fully_shard``:
each rank keeps ``1 / world_size`` of every parameter, its gradient and its
optimizer state, and a layer's parameters are gathered only while the layer
runs (forward and backward), then freed again.

Two settings make a sharded step equal the in-process one:

* **precision** - the sharded parameters are float32 (they *are* the master
  weights the optimizer steps, :mod:`asyncrl.trainers.precision`'s scheme);
  ``MixedPrecisionPolicy`` gathers them in ``policy.dtype`` for compute and
  reduces gradients in float32.
* **no averaging** - FSDP averages gradients over ranks by default. Here every
  rank's loss is a *sum* over its tokens and the trainer divides by the
  step's global token count, so the reduction must be a plain sum: divide
  factor 1, sum-only collectives (gloo has no pre-multiplied sum anyway).
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp._fully_shard._fsdp_collectives import (
    DefaultAllGather,
    DefaultReduceScatter,
)


class CollectiveTimer:
    """Time spent in FSDP's all-gathers and reduce-scatters.

    On the CPU (gloo) a collective returns when it is done: wall time around the
    call. On CUDA (NCCL) the call only enqueues it, so CUDA events around it on
    the collective's stream measure it instead, read when :meth:`take` is called.
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.seconds = 0.0
        self._events: list[tuple[Any, Any]] = []

    def timed(self, call: Any) -> Any:
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = call()
            end.record()
            self._events.append((start, end))
            return result
        t0 = time.perf_counter()
        try:
            return call()
        finally:
            self.seconds += time.perf_counter() - t0

    def take(self) -> float:
        """Seconds since the last call (after the pending collectives finished)."""
        for start, end in self._events:
            end.synchronize()
            self.seconds += start.elapsed_time(end) / 1000.0
        seconds, self.seconds, self._events = self.seconds, 0.0, []
        return seconds


class _TimedAllGather(DefaultAllGather):
    def __init__(self, timer: CollectiveTimer) -> None:
        super().__init__()
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, async_op=False):
        call = super().__call__
        return self.timer.timed(lambda: call(output_tensor, input_tensor, group, async_op))


class _TimedReduceScatter(DefaultReduceScatter):
    def __init__(self, timer: CollectiveTimer) -> None:
        super().__init__()
        self.timer = timer

    def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
        call = super().__call__
        return self.timer.timed(lambda: call(output_tensor, input_tensor, group, op, async_op))


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules sharded as units of their own (the model itself is the last
    unit): the decoder layers (``_no_split_modules``), and the input embedding
    when it is not tied to the output layer - with a vocabulary of 150k it is one
    of the largest matrices, and in the root unit it would be gathered for the
    whole step."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    embed = getattr(model, "get_input_embeddings", lambda: None)()
    head = getattr(model, "get_output_embeddings", lambda: None)()
    if embed is not None and head is not None and embed.weight is not head.weight:
        units = [embed, *units]
    # The output layer stays in the root unit: the chunked loss head applies its
    # weight after the model's forward (trainers/token_logprobs.py, through_root), and
    # the root keeps its parameters gathered from forward to backward.
    return units


def ignore_root_view_warning() -> None:
    """Silence FSDP2's "returned a view tensor ... can cause backward to fail"
    warning for the sharded root (the causal LM itself), in this rank's process.

    Why it is safe here: the root's output is the last hidden state sliced by
    ``logits_to_keep`` (a view), through the bypassed output layer
    (:func:`~asyncrl.trainers.token_logprobs.bypass_output_layer`); its one reader,
    :class:`~asyncrl.trainers.token_logprobs.TokenScorer`, only flattens it and
    ``index_select``s the completion positions - out-of-place ops, so FSDP's
    pre-backward hook on the view is never dropped (what the warning is about).
    The filter matches the message for a ``...ForCausalLM`` root and torch's
    module only: the same warning for any other unit (a decoder layer) still shows."""
    warnings.filterwarnings(
        "ignore", category=UserWarning,
        message=r"FSDP2-wrapped module \(FSDP\w+ForCausalLM\) returned a view tensor",
        module=r"torch\.distributed\.fsdp\._fully_shard\._fsdp_state")


def shard_model(model: torch.nn.Module, mesh: Any, compute_dtype: torch.dtype,
                timer: CollectiveTimer | None = None) -> None:
    """Shard ``model`` (float32 parameters) in place over ``mesh``: see the module
    docstring."""
    policy = MixedPrecisionPolicy(
        param_dtype=None if compute_dtype == torch.float32 else compute_dtype,
        reduce_dtype=torch.float32,
    )
    for unit in shard_units(model):
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    # The root keeps its parameters gathered after forward (the output layer's
    # weight is read then); a forward-only model's scorer reshards it itself.
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
            if timer is not None:
                module.set_custom_all_gather(_TimedAllGather(timer))
                module.set_custom_reduce_scatter(_TimedReduceScatter(timer))


def local_state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes this rank holds of parameters, gradients and optimizer state (its shards)."""

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if hasattr(t, "to_local") else t

    total = 0
    for p in model.parameters():
        total += local(p).nbytes
        if p.grad is not None:
            total += local(p.grad).nbytes
    for state in optimizer.state.values():
        total += sum(local(v).nbytes for v in state.values() if isinstance(v, torch.Tensor))
    return total


__all__ = ["CollectiveTimer", "local_state_bytes", "shard_model", "shard_units"]
