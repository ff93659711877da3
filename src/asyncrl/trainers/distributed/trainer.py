"""``DistributedTrainer``: the sharded trainer as the controller sees it.

It implements the same :class:`~asyncrl.trainers.Trainer` protocol as the
in-process trainer; the work happens in ``world_size`` ranks
(:class:`~asyncrl.trainers.distributed.rank_core.RankCore`) reached through a
:class:`~asyncrl.trainers.distributed.rank_protocol.Ranks` transport.

* ``train_chunk`` splits the chunk over the ranks by tokens
  (:func:`~asyncrl.trainers.distributed.split.split_chunk`); every rank gets a
  share, possibly empty, because every rank must run the same passes. The
  chunk's metrics are computed from the ranks' per-pass sums with the very
  function the in-process trainer uses.
* ``finish_step`` hands every rank the step's token count over all ranks.
* ``get_weights`` gathers the full weights once, tensor by tensor, to rank 0
  and from there to the engines.
* checkpoints: :meth:`sharded_state_dict` (every rank writes its shards,
  ``torch.distributed.checkpoint``), :meth:`load_state_dict` (sharded at any
  world size, or a ``single`` trainer's state), :meth:`state_dict` (the classic
  full state, for export).

A rank that dies, hangs (its peers' collectives time out after
``trainer.collective_timeout_s``) or fails ends the run with one
:class:`~asyncrl.errors.TrainerRankLost` naming it; every rank is stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.errors import TrainerRankLost
from asyncrl.trainers.distributed.rank_protocol import RankDied, RankFailed, Ranks
from asyncrl.trainers.distributed.split import split_chunk
from asyncrl.trainers.state import SHARDED_KEY, is_sharded
from asyncrl.types import Rollout

if TYPE_CHECKING:
    from asyncrl.trainers.distributed.options import ShardedOptions

log = logging.getLogger("asyncrl.trainers.distributed")

#: After a rank failed, how long to wait for the others' answers before naming
#: the culprit: a rank that died makes its peers' collectives fail within
#: milliseconds, and the one that died is the one to name.
DIAGNOSIS_WAIT_S = 1.0
#: How long a clean shutdown may take before the ranks are killed.
CLOSE_TIMEOUT_S = 30.0


class DistributedTrainer:
    """A :class:`~asyncrl.trainers.Trainer` over the ranks of ``ranks``."""

    def __init__(self, ranks: Ranks, options: ShardedOptions, *, weights_device: str = "cpu",
                 run_dir: str | Path | None = None) -> None:
        self.ranks = ranks
        self.world_size = ranks.world_size
        self.loss_cfg = options.rank_trainer.loss
        self.deterministic = options.rank_trainer.deterministic
        self.collective_timeout_s = options.collective_timeout_s
        self.weights_device = weights_device
        self.run_dir = run_dir
        #: Optimizer steps taken = the version of the weights the ranks hold.
        self.version = 0
        self._step_tokens = 0.0
        self._held: list[Rollout] = []
        self._lost: TrainerRankLost | None = None
        self._closed = False

    # ------------------------------------------------------------ protocol
    async def train_chunk(self, rollouts: Sequence[Rollout], *, step: int) -> dict[str, float]:
        self._check_step(step, "train_chunk")
        if self.deterministic:  # as in-process: trained together, in prompt order
            self._held.extend(rollouts)
            return {}
        return await self._train(list(rollouts), step)

    async def finish_step(self, *, step: int) -> dict[str, float]:
        self._check_step(step, "finish_step")
        metrics: dict[str, float] = {}
        if self.deterministic:
            held, self._held = sorted(self._held, key=lambda r: r.prompt.prompt_id), []
            if held:
                metrics.update(await self._train(held, step))
        tokens, self._step_tokens = self._step_tokens, 0.0
        replies = await self._call("finish_step", [(tokens,)] * self.world_size,
                                   f"finish_step of step {step}")
        metrics.update(self._step_metrics(replies, tokens))
        self.version = step + 1
        return metrics

    async def get_weights(self) -> Any:
        replies = await self._call("weights", [()] * self.world_size,
                                   f"gathering the weights of version {self.version}")
        weights = self.ranks.engine_weights(replies[0])
        if self.weights_device != "cpu" and isinstance(weights, dict):
            weights = {k: v.to(self.weights_device) for k, v in weights.items()}
        return weights

    def state_dict(self) -> dict[str, Any]:
        """The whole state in the classic layout, gathered on rank 0 (a ``single``
        trainer loads it as it is); checkpoints use :meth:`sharded_state_dict`."""
        return self._call_sync("full_state", [()] * self.world_size,
                               "gathering the full trainer state")[0]

    def sharded_state_dict(self, directory: str | Path) -> dict[str, Any]:
        """Called when a checkpoint is written: every rank writes its shards into
        ``directory`` (new and empty; on a file system every rank sees); returns
        the small rest of the state, which names ``directory``."""
        small = self._call_sync("save", [(str(directory),)] * self.world_size,
                                f"writing the checkpoint of version {self.version}")[0]
        return {**small, SHARDED_KEY: str(directory)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """A sharded state (any world size) or a classic one (``single``)."""
        header = {"version": int(state["version"]), "torch_rng": state["torch_rng"],
                  "sharded": is_sharded(state)}
        if header["sharded"]:
            header.update(directory=state[SHARDED_KEY], optimizer=state.get("optimizer", True),
                          ref_model=state.get("ref_model", False))
            args: list[tuple[Any, ...]] = [(None, header)] * self.world_size
        else:
            header.update(optimizer=bool(state["optimizer"]["state"]),
                          ref_model="ref_model" in state)
            # Rank 0 gets the full state and broadcasts each rank its shards.
            args = [(state, header)] + [(None, header)] * (self.world_size - 1)
        self._call_sync("load", args, f"loading the checkpoint of version {header['version']}")
        self.version = header["version"]
        self._step_tokens, self._held = 0.0, []

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self.ranks.close, CLOSE_TIMEOUT_S)

    # ------------------------------------------------------------ helpers
    async def _train(self, rollouts: list[Rollout], step: int) -> dict[str, float]:
        from asyncrl.trainers.packing import chunk_metrics, flatten

        shares = split_chunk(rollouts, self.world_size)
        replies = await self._call("train_chunk", [(s,) for s in shares],
                                   f"train_chunk of step {step}")
        rows = [row for reply in replies for row in reply["rows"]]
        # The loss weights of the whole chunk: what the ranks' shares add up to.
        flat = flatten(rollouts, loss=self.loss_cfg, step=step)
        self._step_tokens += flat.weight
        metrics, sums = chunk_metrics(rows, flat)
        if self.loss_cfg.kl_coef > 0:
            metrics["kl"] = sums["kl"] / (flat.weight or 1.0)
        return metrics

    def _step_metrics(self, replies: list[dict[str, float]], tokens: float) -> dict[str, float]:
        metrics = {k: v for k, v in replies[0].items()
                   if k not in ("loss", "state_bytes", "collective_s", "peak_memory_bytes")}
        if tokens > 0:  # each rank's loss is its part of the step's token mean
            metrics["loss"] = sum(r["loss"] for r in replies)
        metrics["world_size"] = float(self.world_size)
        for key in ("state_bytes", "collective_s", "peak_memory_bytes"):
            values = [r[key] for r in replies if key in r]
            if not values:
                continue
            metrics[f"{key}_max"] = max(values)
            for rank, value in enumerate(values):
                metrics[f"rank{rank}_{key}"] = value
        return metrics

    async def _call(self, method: str, args: Sequence[tuple[Any, ...]], what: str) -> list[Any]:
        futures = self._submit(method, args)
        waits = [asyncio.wrap_future(f) for f in futures]
        for w in waits:  # a failure after the first is seen in _failure, not lost
            w.add_done_callback(lambda f: f.cancelled() or f.exception())
        await asyncio.wait(waits, return_when=asyncio.FIRST_EXCEPTION)
        if all(f.done() and f.exception() is None for f in futures):
            return [f.result() for f in futures]
        raise await asyncio.to_thread(self._failure, futures, what)

    def _call_sync(self, method: str, args: Sequence[tuple[Any, ...]], what: str) -> list[Any]:
        futures = self._submit(method, args)
        concurrent.futures.wait(futures, return_when=concurrent.futures.FIRST_EXCEPTION)
        if all(f.done() and f.exception() is None for f in futures):
            return [f.result() for f in futures]
        raise self._failure(futures, what)

    def _submit(self, method: str, args: Sequence[tuple[Any, ...]]) -> list[concurrent.futures.Future]:
        if self._lost is not None:
            raise self._lost
        if self._closed:
            raise RuntimeError(f"DistributedTrainer.{method} called after close()")
        return self.ranks.submit(method, args)

    def _failure(self, futures: list[concurrent.futures.Future], what: str) -> Exception:
        """The error of a failed call. Every rank raised alike (a checkpoint that
        does not load): the ranks are still in step, and the error is theirs.
        Otherwise the ranks are out of step for good: stop them all and name the
        rank at fault - one that died, else one that failed, and any that hung."""
        if not any(isinstance(f.exception(), RankDied) for f in futures if f.done()):
            concurrent.futures.wait(futures, timeout=DIAGNOSIS_WAIT_S)
        errors = [f.exception() if f.done() else None for f in futures]
        if all(isinstance(e, RankFailed) for e in errors):
            return RuntimeError(f"every trainer rank failed {what}: {errors[0].detail}")
        hung = [rank for rank, f in enumerate(futures) if not f.done()]
        self.ranks.kill()
        dead = [e for e in errors if isinstance(e, RankDied)]
        failed = [e for e in errors if isinstance(e, RankFailed)]
        if dead:
            culprit = dead[0]
            head = (f"trainer {self.ranks.describe(culprit.rank)} died during {what} "
                    f"({culprit.detail})")
        elif hung:
            head = (f"trainer {', '.join(self.ranks.describe(r) for r in hung)} did not finish "
                    f"{what}, and the collectives of the others timed out waiting for it "
                    f"(trainer.collective_timeout_s={self.collective_timeout_s:g}): it hung, or "
                    "is slower than that timeout allows")
            if failed:
                head += f"; {failed[0]}"
        else:
            culprit = failed[0]
            head = f"trainer {self.ranks.describe(culprit.rank)} failed during {what}: {culprit.detail}"
        resume = f"asyncrl train --resume {self.run_dir or 'RUN_DIR'}"
        self._lost = TrainerRankLost(
            f"{head}. The other ranks cannot go on without its shards, so the run stops (every "
            f"rank was stopped). Resume from the newest checkpoint with: {resume}")
        log.error("%s", self._lost)
        return self._lost

    def _check_step(self, step: int, what: str) -> None:
        if step != self.version:
            raise ValueError(
                f"DistributedTrainer.{what}(step={step}) but the ranks hold weights of version "
                f"{self.version}: training step v turns weights v into v + 1 (after a resume, "
                "load the checkpoint's trainer state first)")


__all__ = ["DistributedTrainer"]
