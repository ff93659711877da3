"""A rank's side of checkpoints: sharded writes and reads with
``torch.distributed.checkpoint`` (DCP), and the classic full state.

Every function here runs on every rank together (they run collectives). The
layouts are those of :mod:`asyncrl.trainers.state`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from asyncrl.trainers.optim import apply_optimizer_config
from asyncrl.trainers.schedule import advanced
from asyncrl.trainers.state import (
    SHARDED_DIR,
    SHARDED_KEY,
    indexed_optimizer_state,
    master_weights,
    named_optimizer_state,
)

if TYPE_CHECKING:
    from asyncrl.trainers.grpo import GRPOTrainer


class RankCore(Protocol):
    """What these functions read of a rank (:class:`~asyncrl.trainers.distributed.rank_core.RankCore`;
    a protocol here, so that this module does not import the rank's)."""

    rank: int
    world_size: int
    trainer: GRPOTrainer

#: Full (unsharded) tensors on rank 0's host, nothing elsewhere.
_FULL_ON_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
#: Full tensors given to rank 0, each rank keeping its shards of them.
_FROM_RANK0 = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)


def _stepped(core: RankCore) -> bool:
    # Before the first optimizer step there is no optimizer state to save, and
    # asking torch for one would create it (a zero step would count as a step).
    return bool(core.trainer.optimizer.state)


def save_sharded(core: RankCore, directory: str) -> dict[str, Any] | None:
    t = core.trainer
    state: dict[str, Any] = {"model": get_model_state_dict(t.model)}
    if _stepped(core):
        state["optimizer"] = get_optimizer_state_dict(t.model, t.optimizer)
    if t.ref_model is not None:
        state["ref_model"] = get_model_state_dict(t.ref_model)
    dcp.save(state, checkpoint_id=directory)
    if core.rank != 0:
        return None
    return {SHARDED_KEY: SHARDED_DIR, "version": t.version, "torch_rng": torch.get_rng_state(),
            "world_size": core.world_size, "optimizer": "optimizer" in state,
            "ref_model": "ref_model" in state}


def full_state(core: RankCore) -> dict[str, Any] | None:
    t = core.trainer
    model = get_model_state_dict(t.model, options=_FULL_ON_RANK0)
    optimizer = (get_optimizer_state_dict(t.model, t.optimizer, options=_FULL_ON_RANK0)
                 if _stepped(core) else None)
    ref = (get_model_state_dict(t.ref_model, options=_FULL_ON_RANK0)
           if t.ref_model is not None else None)
    if core.rank != 0:
        return None
    state: dict[str, Any] = {
        "model": model,
        # Unstepped: the optimizer's own (empty) state dict is already indexed.
        "optimizer": (indexed_optimizer_state(optimizer) if optimizer is not None
                      else t.optimizer.state_dict()),
        "version": t.version,
        "torch_rng": torch.get_rng_state(),
    }
    if ref is not None:
        state["ref_model"] = ref
    return state


def load(core: RankCore, state: dict[str, Any] | None, header: dict[str, Any]) -> int:
    t = core.trainer
    if header["sharded"]:
        target: dict[str, Any] = {"model": get_model_state_dict(t.model)}
        if header["optimizer"]:
            target["optimizer"] = get_optimizer_state_dict(t.model, t.optimizer)
        if header["ref_model"] and t.ref_model is not None:
            target["ref_model"] = get_model_state_dict(t.ref_model)
        dcp.load(target, checkpoint_id=header["directory"])  # reshards to this world size
        set_model_state_dict(t.model, target["model"])
        if "optimizer" in target:
            set_optimizer_state_dict(t.model, t.optimizer, target["optimizer"])
        if "ref_model" in target:
            set_model_state_dict(t.ref_model, target["ref_model"])
    else:
        given = state is not None
        set_model_state_dict(t.model, master_weights(state) if given else {},
                             options=_FROM_RANK0)
        if header["optimizer"]:
            names = [n for n, p in t.model.named_parameters() if p.requires_grad]
            named = named_optimizer_state(state["optimizer"], names) if given else {}
            set_optimizer_state_dict(t.model, t.optimizer, named, options=_FROM_RANK0)
        if header["ref_model"] and t.ref_model is not None:
            ref = {k: v.float() for k, v in state["ref_model"].items()} if given else {}
            set_model_state_dict(t.ref_model, ref, options=_FROM_RANK0)
    if not header["optimizer"]:  # saved before the first step: a fresh optimizer
        t.optimizer.state.clear()
    # The checkpoint's moments, the config's hyper-parameters (lr changed on resume);
    # every rank sets them on its own shards' optimizer.
    apply_optimizer_config(t.optimizer, t.opt_cfg)
    t.version = int(header["version"])
    # Every rank's schedule at the rate of step `version` (the ranks step in lockstep).
    t.scheduler = advanced(t.optimizer, t.scheduler_cfg, t.version)
    torch.set_rng_state(header["torch_rng"])
    t.optimizer.zero_grad(set_to_none=True)
    return t.version


__all__ = ["full_state", "load", "save_sharded"]
