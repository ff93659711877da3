"""Trainer states across strategies and world sizes: the one format every
trainer reads.

Two layouts of the same state:

* **classic** (``trainer.strategy: single``, ``trainer.pt`` holds it all): the
  model state dict in the model's dtype, the float32 masters of low-precision
  parameters (``master``), the optimizer state keyed by parameter *index* (the
  order of the model's trainable parameters), ``version``, ``torch_rng``.
* **sharded** (``fsdp``, any world size): ``trainer.pt`` holds only
  :data:`SHARDED_KEY` (the directory of a ``torch.distributed.checkpoint``
  beside it), ``version``, ``torch_rng`` and ``world_size``; the directory holds
  ``model`` (float32 master weights, the parameters an fsdp trainer keeps),
  ``optimizer`` (keyed by parameter *name*) and ``ref_model`` (with a KL term),
  each rank having written its own shards.

``torch.distributed.checkpoint`` reshards on load, so a sharded state loads at
any world size; :func:`unshard_state` turns one into the classic layout (for
``single``, and for export), :func:`named_optimizer_state` turns a classic
optimizer state into the by-name layout fsdp ranks load. Both are exact: only
keys move, no value is recomputed.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Key of ``trainer.pt`` naming the sharded directory (relative in the file;
#: :func:`asyncrl.checkpoint.store.iter_checkpoints` makes it absolute).
SHARDED_KEY = "sharded"
#: The directory's name inside a checkpoint.
SHARDED_DIR = "trainer"


def is_sharded(state: dict[str, Any]) -> bool:
    return SHARDED_KEY in state


def read_sharded(directory: str | Path) -> dict[str, Any]:
    """Everything a sharded checkpoint directory holds, as full (unsharded) CPU
    tensors in nested dicts, read in this process without a process group."""
    # What torch's own dcp_to_torch_save does, without the file in between: the
    # planner builds the state dict from the checkpoint's metadata, so no template
    # (and no model) is needed.
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    state: dict[str, Any] = {}
    with warnings.catch_warnings():  # "no process group: loading in one process" - yes
        warnings.simplefilter("ignore", UserWarning)
        _load_state_dict(state, storage_reader=FileSystemReader(str(directory)),
                         planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def unshard_state(state: dict[str, Any]) -> dict[str, Any]:
    """The classic layout of a trainer state (a sharded one is read from its
    directory; a classic one is returned as it is)."""
    if not is_sharded(state):
        return state
    full = read_sharded(state[SHARDED_KEY])
    classic: dict[str, Any] = {
        # float32 masters: loaded into a low-precision model they round exactly as
        # fsdp's mixed-precision compute copy does, and they are the masters.
        "model": full["model"],
        "optimizer": indexed_optimizer_state(full["optimizer"]),
        "version": int(state["version"]),
        "torch_rng": state["torch_rng"],
    }
    if "ref_model" in full:
        classic["ref_model"] = full["ref_model"]
    return classic


def indexed_optimizer_state(named: dict[str, Any]) -> dict[str, Any]:
    """A by-name optimizer state dict (``torch.distributed.checkpoint.state_dict``'s
    layout) as ``torch.optim.Optimizer.state_dict()`` lays it out: parameters
    numbered in the order the param groups list them."""
    index: dict[str, int] = {}
    groups = []
    for group in named["param_groups"]:
        names = list(group["params"])
        ids = [index.setdefault(name, len(index)) for name in names]
        groups.append({**group, "params": ids})
    return {"state": {index[name]: dict(s) for name, s in named["state"].items()},
            "param_groups": groups}


def named_optimizer_state(indexed: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """The inverse of :func:`indexed_optimizer_state`: ``names`` are the trainable
    parameters in the optimizer's order (how a classic trainer numbered them)."""
    groups = []
    for group in indexed["param_groups"]:
        groups.append({**group, "params": [names[i] for i in group["params"]]})
    return {"state": {names[int(i)]: dict(s) for i, s in indexed["state"].items()},
            "param_groups": groups}


def master_weights(classic: dict[str, Any]) -> dict[str, Any]:
    """The float32 weights of a classic state: its masters where it has them
    (a low-precision run), its model weights elsewhere (exact in float32)."""
    masters = classic.get("master") or {}
    weights = {name: masters.get(name, value) for name, value in classic["model"].items()}
    return {name: v.float() if v.is_floating_point() else v for name, v in weights.items()}


__all__ = [
    "SHARDED_DIR",
    "SHARDED_KEY",
    "indexed_optimizer_state",
    "is_sharded",
    "master_weights",
    "named_optimizer_state",
    "read_sharded",
    "unshard_state",
]
