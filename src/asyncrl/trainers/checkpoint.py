"""The in-process trainer's state in the classic layout of
:mod:`asyncrl.trainers.state`: what :meth:`GRPOTrainer.state_dict
<asyncrl.trainers.grpo.GRPOTrainer.state_dict>` writes into ``trainer.pt`` and
what its ``load_state_dict`` reads back (a sharded state is unsharded first).

A LoRA trainer keeps its adapters only (the base weights are rebuilt from the
config); a low-precision model keeps its float32 masters beside its weights;
the optimizer's moments are the checkpoint's, its hyper-parameters the
config's (a resume may change the learning rate).
"""

from __future__ import annotations

from typing import Any

import torch

from asyncrl.config import OptimizerConfig
from asyncrl.trainers import lora as lora_
from asyncrl.trainers.optim import apply_optimizer_config
from asyncrl.trainers.precision import MasterWeights
from asyncrl.trainers.snapshot import CPU, detached, moved, trained_weights
from asyncrl.trainers.state import SHARDED_KEY, unshard_state


def classic_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                  precision: MasterWeights, *, version: int, lora: Any,
                  ref_model: torch.nn.Module | None, copy: bool) -> dict[str, Any]:
    """The trainer's state; ``copy``: clone the tensors (else tensors already on
    the CPU are shared: for when no trainer call follows)."""
    state = {
        "optimizer": detached(optimizer.state_dict(), copy=copy),
        "version": version,
        "torch_rng": torch.get_rng_state(),
    }
    if lora is not None:
        # The base weights are rebuilt from the config: only the adapters change.
        state["adapter"] = lora_.adapter_state_dict(model, copy=copy)
    else:
        state["model"] = moved(model.state_dict(), CPU, copy=copy)
    if precision.mixed:
        state["master"] = precision.state_dict(copy=copy)
    if precision.scaler is not None:
        state["grad_scaler"] = precision.scaler_state()
    if ref_model is not None:
        state["ref_model"] = moved(ref_model.state_dict(), CPU, copy=copy)
    return state


def load_classic_state(state: dict[str, Any], model: torch.nn.Module,
                       optimizer: torch.optim.Optimizer, precision: MasterWeights, *,
                       opt_cfg: OptimizerConfig, lora: Any,
                       ref_model: torch.nn.Module | None) -> int:
    """Load ``state`` (classic or sharded) into the trainer's parts and the torch
    RNG; returns its version (the trainer sets its schedule from it)."""
    if SHARDED_KEY in state:  # written by trainer.strategy: fsdp (any world size)
        state = unshard_state(state)
    if lora is not None:
        lora_.load_adapter_state(model, trained_weights(state, "adapter"))
        weights = state["adapter"]
    else:
        weights = trained_weights(state, "model")
        model.load_state_dict(weights)
    # A checkpoint of a float32 run has no masters: its weights are exact ones.
    precision.load(state.get("master", weights))
    precision.load_scaler_state(state.get("grad_scaler"))
    optimizer.load_state_dict(state["optimizer"])
    # The checkpoint's moments, the config's hyper-parameters (lr changed on resume).
    apply_optimizer_config(optimizer, opt_cfg)
    torch.set_rng_state(state["torch_rng"])
    if ref_model is not None and "ref_model" in state:
        ref_model.load_state_dict(state["ref_model"])
    return int(state["version"])


__all__ = ["classic_state", "load_classic_state"]
