"""LoRA on the policy (``policy.lora``), with peft.

The adapters are injected into the model in place (``peft.get_peft_model``), so
the trainer keeps calling the same transformers model, now with low-rank
adapters beside its linear layers and every other parameter frozen. What goes
anywhere else is adapter-free:

* the engines get :func:`merged_state_dict` - the base model's own parameter
  names, each adapted weight ``W + (alpha / r) B A`` - so an engine (local or
  vLLM) never knows LoRA was used, and samples from exactly the function the
  trainer scores with (up to the rounding of the merge);
* checkpoints hold :func:`adapter_state_dict` (and the optimizer, which holds
  nothing else): the base weights are rebuilt from the config as at the start;
* ``final/`` is the merged model, with the adapter beside it (:func:`save_adapter`);
* the KL reference is the model with the adapters switched off
  (:func:`adapters_disabled`), not a second copy of it.

peft is an optional extra (``pip install 'asyncrl[lora]'``), imported only here
and only when LoRA is configured.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.errors import ConfigError, require

if TYPE_CHECKING:
    from asyncrl.config import LoraConfig

_ADAPTER = "default"  # peft's name of the one adapter


def _peft() -> Any:
    return require("peft", "lora", "policy.lora")


def apply_lora(model: torch.nn.Module, cfg: LoraConfig) -> Any:
    """Inject adapters into ``model`` (in place) and return peft's wrapper of it.

    The model stays in eval mode (no dropout anywhere: the trainer must score
    tokens as the engine sampled them); only the adapters' own dropout is
    switched on when ``cfg.dropout > 0``.
    """
    peft = _peft()
    targets = cfg.target_modules if isinstance(cfg.target_modules, str) else list(
        cfg.target_modules)
    config = peft.LoraConfig(r=cfg.r, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                             target_modules=targets, bias="none")
    try:
        wrapped = peft.get_peft_model(model, config)
    except ValueError as exc:  # peft: "Target modules {...} not found in the base model"
        names = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                        if isinstance(m, torch.nn.Linear)})
        raise ConfigError(
            f"policy.lora.target_modules={cfg.target_modules!r}: {exc}. The model's linear "
            f"layers are named {names}; list some of them, or use \"all-linear\""
        ) from None
    wrapped.eval()
    if cfg.dropout > 0:
        for name, module in model.named_modules():
            if name.endswith(f"lora_dropout.{_ADAPTER}"):
                module.train()
    return wrapped


def is_lora(model: torch.nn.Module) -> bool:
    """True when ``model`` carries adapters."""
    return any(".lora_" in name for name, _ in model.named_parameters())


def _lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLayer)}


def merged_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of the model the adapters describe, under the base model's
    names: what a model without adapters loads. Adapted weights are new tensors;
    the others are the model's own (copy them before they travel)."""
    state: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        state[key.replace(".base_layer.", ".")] = value
    with torch.no_grad():
        for name, layer in _lora_layers(model).items():
            weight = state[f"{name}.weight"]
            delta = layer.get_delta_weight(_ADAPTER)
            state[f"{name}.weight"] = (weight.float() + delta.float()).to(weight.dtype)
    return state


def adapter_state_dict(model: torch.nn.Module, *, copy: bool = True) -> dict[str, torch.Tensor]:
    """The adapters' parameters (the trainable ones) on the CPU: copies, or (not
    ``copy``) the parameters themselves where they are on the CPU."""
    return {name: p.detach().to("cpu", copy=copy)
            for name, p in model.named_parameters() if p.requires_grad}


def load_adapter_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load :func:`adapter_state_dict` into ``model``'s adapters; a checkpoint of
    other adapters (another rank or target list) is refused, naming the difference."""
    params = {name: p for name, p in model.named_parameters() if p.requires_grad}
    missing, unexpected = sorted(set(params) - set(state)), sorted(set(state) - set(params))
    if missing or unexpected:
        raise ConfigError(
            "the checkpoint's LoRA adapters do not match policy.lora "
            f"(missing: {missing[:3]}, unexpected: {unexpected[:3]}); resume with the "
            "policy.lora block the run was started with"
        )
    with torch.no_grad():
        for name, p in params.items():
            if p.shape != state[name].shape:
                raise ConfigError(
                    f"the checkpoint's LoRA adapter {name} has shape {tuple(state[name].shape)}, "
                    f"policy.lora gives {tuple(p.shape)}: resume with the policy.lora.r the run "
                    "was started with"
                )
            p.copy_(state[name])


@contextlib.contextmanager
def adapters_disabled(wrapped: Any) -> Iterator[None]:
    """The base model, for the KL reference: the adapters are bypassed inside."""
    with wrapped.disable_adapter():
        yield


def save_adapter(wrapped: Any, directory: str | Path) -> Path:
    """Write the adapter in peft's format (``adapter_config.json``,
    ``adapter_model.safetensors``): ``PeftModel.from_pretrained(base, directory)``
    loads it onto the base model."""
    out = Path(directory)
    wrapped.save_pretrained(out, safe_serialization=True)
    return out
