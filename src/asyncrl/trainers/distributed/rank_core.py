"""One rank of the sharded trainer: a :class:`GRPOTrainer` over an FSDP2 model.

The rank runs the in-process trainer's own code on its share of each chunk;
the hooks of :class:`~asyncrl.trainers.grpo.GRPOTrainer` make the ranks
together compute the single-process step:

* ``plan_passes`` and ``passes=`` - every rank runs as many forward/backward
  passes as the rank with the most (an all-reduce of the planned counts, before
  the first pass); the extra ones carry loss weight 0 (zero loss, zero
  gradient), but they take part in FSDP's gathers and reductions, so no rank
  waits forever for another;
* gradients are summed over ranks (:mod:`~asyncrl.trainers.distributed.sharding`);
* ``step_token_count`` - the step's summed gradient is divided by the token
  count (the sum of loss weights) of *all* ranks (the controller sums them and
  hands it to ``finish_step``): the same token mean as in-process;
* the chunked loss head runs on the whole model's forward: FSDP gathers, and
  reduce-scatters the gradients of, a unit's parameters only around that unit's
  own forward, so the output layer passes its hidden states through
  (:func:`~asyncrl.trainers.token_logprobs.bypass_output_layer`), its weight is the
  root unit's (gathered from forward to backward), and the head applies it
  chunk by chunk as in-process: no ``tokens x vocabulary`` tensor on a rank
  either. ``output_grad_sink`` is None: FSDP reduces every gradient itself.

:class:`RankCore` is what a rank process (or Ray actor) serves: every method is
called on every rank, in the same order (they run collectives), by
:class:`~asyncrl.trainers.distributed.trainer.DistributedTrainer`.
"""

from __future__ import annotations

import datetime
import os
import socket
import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from asyncrl.policy.devices import policy_dtype
from asyncrl.trainers.distributed.sharding import (
    CollectiveTimer,
    ignore_root_view_warning,
    local_state_bytes,
    shard_model,
)
from asyncrl.trainers.grpo import GRPOTrainer
from asyncrl.trainers.token_logprobs import bypass_output_layer

if TYPE_CHECKING:
    from asyncrl.trainers.distributed.options import ShardedOptions
    from asyncrl.types import Rollout


@dataclass(frozen=True)
class RankSpec:
    """What every rank is started with."""

    options: ShardedOptions
    #: Gives a from-scratch model its vocabulary (as for the in-process trainer).
    task: Any
    #: ``tcp://host:port`` of the rendezvous store, served already (by the
    #: controller, or rank 0's actor): every rank connects as a client, so none
    #: waits for another's server to come up (a client that comes too early backs
    #: off for seconds).
    init_method: str

    @property
    def world_size(self) -> int:
        return self.options.world_size


@dataclass
class WeightStream:
    """The full weights, gathered one tensor at a time (all ranks gather; rank 0
    receives). ``header``: ``(name, dtype, shape, alias)`` per state-dict entry,
    ``alias`` the index in ``header`` of an earlier entry it shares storage with
    (tied embeddings), else None; ``tensors`` yields, for each entry without an
    alias, the full tensor on rank 0 (None elsewhere)."""

    header: list[tuple[str, str, tuple[int, ...], int | None]]
    tensors: Iterator[torch.Tensor | None]


class RankTrainer(GRPOTrainer):
    """The in-process trainer with the data-parallel hooks."""

    #: The step's token count over all ranks (set before ``finish_step_sync``).
    global_tokens = 0.0

    def agreed_passes(self, share: Sequence[Rollout]) -> int:
        """The most passes any rank's share needs (every rank calls it)."""
        count = torch.tensor([self.plan_passes(share)], dtype=torch.int64, device=self._device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    def step_token_count(self, local: float) -> float:
        return self.global_tokens


class RankCore:
    """One rank: process group, sharded policy (and KL reference), optimizer."""

    def __init__(self, spec: RankSpec, rank: int, *, device_index: int | None = None) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        from asyncrl.policy.build import build_policy

        o = spec.options
        self.rank, self.world_size = rank, spec.world_size
        if o.rank_trainer.num_threads is not None:
            torch.set_num_threads(o.rank_trainer.num_threads)
        self.device = torch.device("cpu")
        if o.policy.device.startswith("cuda"):
            self.device = torch.device("cuda", rank if device_index is None else device_index)
            torch.cuda.set_device(self.device)
        timeout = datetime.timedelta(seconds=o.collective_timeout_s)
        where = urllib.parse.urlparse(spec.init_method)
        store = dist.TCPStore(where.hostname, where.port, spec.world_size, is_master=False,
                              timeout=timeout)
        dist.init_process_group(o.backend, store=store, rank=rank,
                                world_size=spec.world_size, timeout=timeout)
        mesh = init_device_mesh(self.device.type, (spec.world_size,))
        self.dtype = policy_dtype(o.policy.dtype, self.device)
        # Built in float32 on the host and sharded onto the device: a rank never
        # holds the whole model on its device, and the shards are the masters.
        host = o.policy.model_copy(update={"device": "cpu", "dtype": "float32"})
        self.timer = CollectiveTimer(self.device)
        model, tokenizer = build_policy(host, spec.task, seed=o.seed)
        shard_model(model, mesh, self.dtype, self.timer)
        bypass_output_layer(model)
        ignore_root_view_warning()  # the scorer reads the root's view out-of-place
        ref = None
        if o.rank_trainer.loss.kl_coef > 0:  # sharded like the policy, never a full copy per rank
            ref, _ = build_policy(host, spec.task, seed=o.seed)
            shard_model(ref, mesh, self.dtype)
            bypass_output_layer(ref)
        self.trainer = RankTrainer.from_options(o.rank_trainer, model=model, tokenizer=tokenizer,
                                                score_through_root=True, ref_model=ref)
        self.trainer.output_grad_sink = None  # FSDP reduces every gradient itself

    # ------------------------------------------------------------ commands
    def info(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(),
                "device": str(self.device), "version": self.trainer.version}

    def train_chunk(self, share: Sequence[Rollout]) -> dict[str, Any]:
        """Forward/backward over this rank's share; the per-pass stats rows (the
        caller combines the ranks')."""
        trainer = self.trainer
        trainer.train_chunk_sync(share, passes=trainer.agreed_passes(share))
        return {"rows": trainer.last_chunk_rows}

    def finish_step(self, global_tokens: float) -> dict[str, float]:
        """The optimizer step on this rank's shards, divided by ``global_tokens``.
        ``loss`` is this rank's part of the step's mean (the parts add up)."""
        trainer = self.trainer
        state_bytes = local_state_bytes(trainer.model, trainer.optimizer)
        trainer.global_tokens = global_tokens
        metrics = trainer.finish_step_sync()
        metrics["state_bytes"] = float(state_bytes)
        metrics["collective_s"] = self.timer.take()
        if self.device.type == "cuda":
            metrics["peak_memory_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)
        return metrics

    def weights(self) -> WeightStream:
        """The model's full state dict in ``policy.dtype``, gathered tensor by
        tensor: rank 0 never holds more than one full tensor it has not sent."""
        model = self.trainer.model
        # Tied weights are one parameter under two names: sent once. Decided by
        # the module structure, which every rank shares (not by shard storage).
        param_of = {name: id(p) for name, p in model.named_parameters(remove_duplicate=False)}
        header: list[tuple[str, str, tuple[int, ...], int | None]] = []
        unique: list[torch.Tensor] = []
        first: dict[int, int] = {}
        for name, t in model.state_dict().items():
            key = param_of.get(name)
            if key is not None and key in first:
                header.append((name, "", tuple(t.shape), first[key]))
                continue
            if key is not None:
                first[key] = len(header)
            dtype = self.dtype if t.is_floating_point() else t.dtype
            header.append((name, str(dtype).removeprefix("torch."), tuple(t.shape), None))
            unique.append(t)
        return WeightStream(header, self._gather(unique))

    def _gather(self, tensors: list[torch.Tensor]) -> Iterator[torch.Tensor | None]:
        for t in tensors:
            full = t.full_tensor() if hasattr(t, "full_tensor") else t
            if self.rank == 0:
                dtype = self.dtype if full.is_floating_point() else full.dtype
                yield full.detach().to("cpu", dtype)
            else:
                yield None

    def full_state(self) -> dict[str, Any] | None:
        """The whole trainer state in the classic layout on rank 0 (None elsewhere)."""
        from asyncrl.trainers.distributed import checkpoint

        return checkpoint.full_state(self)

    def save(self, directory: str) -> dict[str, Any] | None:
        """Write this rank's shards of a sharded checkpoint into ``directory``;
        rank 0 returns what goes into ``trainer.pt``."""
        from asyncrl.trainers.distributed import checkpoint

        return checkpoint.save_sharded(self, directory)

    def load(self, state: dict[str, Any] | None, header: dict[str, Any]) -> int:
        """Load a sharded checkpoint (every rank reads its shards) or a classic
        state (given to rank 0 only, broadcast from there); returns the version."""
        from asyncrl.trainers.distributed import checkpoint

        return checkpoint.load(self, state, header)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


__all__ = ["RankCore", "RankSpec", "RankTrainer", "WeightStream"]
