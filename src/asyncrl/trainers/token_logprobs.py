"""How the trainer runs the model over a micro-batch: the log-prob and entropy of
every completion token, and activation checkpointing.

A transformers causal LM is a decoder (the hidden state of every position)
followed by one linear output layer. :class:`TokenScorer` runs the decoder, keeps
the hidden states of the positions that predict completion tokens only, and
hands them to the chunked loss head (:mod:`asyncrl.trainers.loss_head`), so no
``tokens x vocabulary`` tensor is ever built. A model whose logits are not that
linear layer of the last hidden state (a soft cap, a scale) is detected when the
scorer is built, and scored through its full logits instead, with a warning.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from asyncrl.errors import ConfigError
from asyncrl.trainers.loss_head import (
    GradSink,
    chunk_tokens,
    chunked_logprobs,
    full_logprobs,
)
from asyncrl.trainers.packing import Packed

log = logging.getLogger("asyncrl.trainers")


class TokenScorer:
    """``(log p(y), entropy)`` in float32 of a micro-batch's completion tokens
    under ``softmax(logits / temperature)``, for a model of the policy's class.

    ``chunk``: tokens per loss chunk (None: :func:`chunk_tokens` of the
    vocabulary). ``full_vocab``: score through the model's full logits, as the
    trainer did before the chunked head (kept as the reference).
    ``through_root``: the model's output layer passes its input through
    (:func:`bypass_output_layer`), so the whole model's forward returns the last
    hidden states: a sharded model (FSDP2) gathers its parameters, and
    reduce-scatters their gradients, only around its own modules' forward.
    """

    def __init__(self, model: torch.nn.Module, *, temperature: float, chunk: int | None = None,
                 full_vocab: bool = False, through_root: bool = False) -> None:
        self.temperature = temperature
        head = model.get_output_embeddings()
        self.vocab_size = int(head.weight.shape[0])
        self.chunk = chunk or chunk_tokens(self.vocab_size)
        self.through_root = through_root
        self.chunked = through_root or (not full_vocab and _is_linear_head(model))

    def __call__(self, model: torch.nn.Module, batch: Packed, *,
                 weight_grad: GradSink | None = None) -> tuple[Tensor, Tensor]:
        """``weight_grad``: where the output layer's weight gradient accumulates
        (see :func:`~asyncrl.trainers.loss_head.chunked_logprobs`; None: autograd)."""
        if not self.chunked:
            logits = model(input_ids=batch.ids, use_cache=False).logits
            return full_logprobs(logits, batch.positions, batch.targets,
                                 temperature=self.temperature)
        if self.through_root:
            hidden = model(input_ids=batch.ids, use_cache=False).logits
        else:
            hidden = model.get_decoder()(input_ids=batch.ids, use_cache=False).last_hidden_state
        h = hidden.flatten(0, 1).index_select(0, batch.positions)
        head = model.get_output_embeddings()
        out = chunked_logprobs(h, head.weight, head.bias, batch.targets,
                               temperature=self.temperature, chunk=self.chunk,
                               weight_grad=weight_grad)
        if self.through_root and not torch.is_grad_enabled() and hasattr(model, "reshard"):
            model.reshard()  # forward only (the KL reference): no backward will reshard it
        return out


def _pass_through(hidden: Tensor) -> Tensor:
    return hidden


def bypass_output_layer(model: torch.nn.Module) -> None:
    """Make ``model``'s output layer pass its input through, so that the model's
    forward returns its last hidden states as ``logits`` (for
    ``TokenScorer(through_root=True)``, which applies the layer's weight itself,
    chunk by chunk). The weight stays where it is: state dicts do not change."""
    model.get_output_embeddings().forward = _pass_through


def _is_linear_head(model: torch.nn.Module) -> bool:
    """True when the model's logits are its output layer applied to its decoder's
    last hidden state (checked on two tokens)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or not hasattr(model, "get_decoder"):
        log.warning("%s has no linear output layer: the trainer scores tokens through its "
                    "full logits (memory grows with tokens x vocabulary)", type(model).__name__)
        return False
    device = head.weight.device
    if device.type == "meta":
        return True  # nothing to compare; the structure is that of a plain head
    ids = torch.tensor([[0, 1]], device=device) % head.weight.shape[0]
    with torch.no_grad():
        logits = model(input_ids=ids, use_cache=False).logits
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state
        same = torch.allclose(head(hidden).float(), logits.float(), rtol=1e-3, atol=1e-4)
    if not same:
        log.warning("the logits of %s are not its output layer over the last hidden state "
                    "(a soft cap or scale?): the trainer scores tokens through its full logits "
                    "(memory grows with tokens x vocabulary)", type(model).__name__)
    return same


def enable_checkpointing(model: torch.nn.Module) -> None:
    """Activation checkpointing of every decoder layer (transformers' own,
    non-reentrant): a layer keeps only its input for the backward pass, which
    recomputes the rest. Exact: the recomputation runs the same kernels.

    transformers checkpoints a layer only while that layer is in training mode,
    and the policy stays in eval mode for good (dropout would make the trainer's
    log-probs differ from the engine's): so the checkpointed layers themselves
    are flagged as training, and nothing inside them (attention dropout reads
    its own module's flag).
    """
    enable = getattr(model, "gradient_checkpointing_enable", None)
    try:
        if enable is None:
            raise ValueError("not a transformers model")
        enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    except ValueError as exc:  # transformers: "... does not support gradient checkpointing"
        raise ConfigError(f"policy.gradient_checkpointing: {type(model).__name__} cannot be "
                          f"checkpointed ({exc}); set it to false") from None
    for module in model.modules():
        if getattr(module, "gradient_checkpointing", False) is True:
            module.training = True
