"""Copies of a trainer's tensors for checkpoints and engines: taken without
stalling the event loop, shared where a tensor is already where it goes."""

from __future__ import annotations

from copy import deepcopy
from typing import Any

import torch

from asyncrl.errors import ConfigError


def detached(tree: Any, *, copy: bool) -> Any:
    """``tree`` with its tensors detached and (``copy``) cloned by torch, which lets
    other threads run meanwhile (``copy.deepcopy`` clones tensor storages holding
    the GIL: a checkpoint taken off the event loop would still stall it for tens
    of ms); what is not a tensor is deep-copied either way."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone() if copy else tree.detach()
    if isinstance(tree, dict):
        return {k: detached(v, copy=copy) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(detached(v, copy=copy) for v in tree)
    return deepcopy(tree)


def trained_weights(state: dict[str, Any], key: str) -> dict[str, torch.Tensor]:
    if key not in state:
        other = "full-model" if key == "adapter" else "LoRA"
        raise ConfigError(
            f"the checkpoint holds a {other} trainer (no {key!r} weights): resume with the "
            "policy.lora setting the run was started with"
        )
    return state[key]


#: Where checkpoint states are held.
CPU = torch.device("cpu")


def moved(state: dict[str, torch.Tensor], device: torch.device, *,
           copy: bool = True) -> dict[str, torch.Tensor]:
    """``state``'s tensors on ``device``: copies (``copy``), or the tensors
    themselves where they are on ``device`` already. Entries that are one tensor
    (tied input and output embeddings: a quarter of Qwen2.5-0.5B's parameters)
    stay one: copied once, and saved once by ``torch.save``, which writes a
    storage shared by several entries a single time."""
    moved: dict[tuple, torch.Tensor] = {}
    out = {}
    for name, tensor in state.items():
        key = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(),
               tuple(tensor.shape), tensor.stride(), tensor.dtype)
        if key not in moved:
            moved[key] = tensor.detach().to(device, copy=copy)
        out[name] = moved[key]
    return out


__all__ = ["CPU", "detached", "moved", "trained_weights"]
