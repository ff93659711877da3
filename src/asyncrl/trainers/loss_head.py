"""Log-probs and entropies of the sampled tokens without a ``tokens x vocabulary`` tensor.

The output layer turns each position's hidden state ``h`` into logits
``z = (h W^T + b) / T`` over the whole vocabulary; the loss needs only, per
completion token, ``log p(y) = z_y - logsumexp(z)`` and the entropy
``H = -sum p log p``. :class:`ChunkedLogprobs` computes them over ``chunk``
tokens at a time and keeps nothing of the vocabulary width: the backward pass
recomputes each chunk's logits and turns them straight into the gradients of
``h``, ``W`` and ``b``. So the memory of the loss head is
``O(chunk x vocabulary)`` - a few hundred MB at a 152k vocabulary - whatever
the number of tokens, where the logits of a whole micro-batch in float32 would
be ``4 x tokens x vocabulary`` bytes, several times over.

Gradients, with ``g`` and ``g_H`` the incoming gradients of ``log p(y)`` and
``H`` (``d log p(y) / dz = onehot(y) - p``, ``dH / dz = -p (log p + H)``)::

    dz = g onehot(y) - p (g + g_H (log p + H))
    dh = (dz / T) W        dW = (dz / T)^T h        db = sum (dz / T)

The logits are computed in the model's dtype and upcast to float32, the
arithmetic after them is float32 - what the full-vocabulary path does - and the
weight gradient is accumulated over the chunks in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

#: Elements of one float32 ``[chunk, vocabulary]`` tensor: 2**26 (256 MiB), i.e.
#: 441 tokens at Qwen2's 151,936 ids, and one chunk for any toy vocabulary.
CHUNK_ELEMENTS = 2**26


def chunk_tokens(vocab_size: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Tokens per loss chunk for a vocabulary of ``vocab_size``."""
    return max(1, elements // max(vocab_size, 1))


def _chunk_log_softmax(h: Tensor, weight: Tensor, bias: Tensor | None,
                       temperature: float) -> Tensor:
    """``log softmax((h W^T + b) / T)`` of one chunk, ``[C, V]`` in float32."""
    z = torch.nn.functional.linear(h, weight, bias).float()
    if temperature != 1.0:
        z.div_(temperature)  # a new tensor either way: the output of linear, or its copy
    return torch.log_softmax(z, dim=-1)


#: Where the output layer's weight gradient goes instead of through autograd:
#: called once per backward pass, it returns the float32 tensor to add it into.
GradSink = Callable[[], Tensor]


class ChunkedLogprobs(torch.autograd.Function):
    """``(log p(y), H)`` per row of ``hidden`` ``[N, H]`` for ``targets`` ``[N]``,
    computed ``chunk`` rows at a time (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor,
                temperature: float, chunk: int, weight_grad: GradSink | None
                ) -> tuple[Tensor, Tensor]:
        n = hidden.shape[0]
        logp = hidden.new_empty(n, dtype=torch.float32)
        entropy = hidden.new_empty(n, dtype=torch.float32)
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            logp_all = _chunk_log_softmax(hidden[lo:hi], weight, bias, temperature)
            logp[lo:hi] = logp_all.gather(-1, targets[lo:hi, None])[:, 0]
            entropy[lo:hi] = -logp_all.exp().mul_(logp_all).sum(-1)
            del logp_all
        ctx.save_for_backward(hidden, weight, bias, targets, entropy)
        ctx.temperature, ctx.chunk, ctx.weight_grad = temperature, chunk, weight_grad
        # An output the loss does not use (the entropy, without an entropy bonus)
        # gets None, not zeros: its [chunk, vocabulary] terms are skipped.
        ctx.set_materialize_grads(False)
        return logp, entropy

    @staticmethod
    def backward(ctx: Any, g_logp: Tensor | None, g_entropy: Tensor | None):  # type: ignore[override]
        hidden, weight, bias, targets, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w: Tensor | None = None
        if need_w:
            grad_w = (ctx.weight_grad() if ctx.weight_grad is not None
                      else torch.zeros_like(weight, dtype=torch.float32))
        grad_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        n = hidden.shape[0]
        for lo in range(0, n, chunk):
            hi = min(lo + chunk, n)
            h = hidden[lo:hi]
            with torch.no_grad():
                d = _chunk_grad_logits(_chunk_log_softmax(h, weight, bias, temperature),
                                       targets[lo:hi], entropy[lo:hi],
                                       None if g_logp is None else g_logp[lo:hi],
                                       None if g_entropy is None else g_entropy[lo:hi],
                                       temperature).to(hidden.dtype)
                if grad_h is not None:
                    grad_h[lo:hi] = d @ weight
                if grad_w is not None:
                    if d.dtype == grad_w.dtype:  # in place: no [vocabulary, hidden] temporary
                        grad_w.addmm_(d.t(), h)
                    else:
                        grad_w.add_(d.t() @ h)
                if grad_b is not None:
                    grad_b.add_(d.sum(0).float())
                # Freed now, not when the next chunk rebinds it: else each chunk
                # after the first holds two chunks' logits gradients at once.
                del d
        if grad_w is not None:
            # Added into the sink: nothing more to hand to autograd.
            grad_w = None if ctx.weight_grad is not None else grad_w.to(weight.dtype)
        if grad_b is not None:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None, None, None


def _chunk_grad_logits(logp_all: Tensor, targets: Tensor, entropy: Tensor, g_logp: Tensor | None,
                       g_entropy: Tensor | None, temperature: float) -> Tensor:
    """The gradient of one chunk's logits from those of ``log p(y)`` and ``H``
    (module docstring), computed in place of ``logp_all``."""
    p = logp_all.exp()
    # coeff = g + g_H (log p + H), per element; dz = g onehot(y) - p coeff
    if g_entropy is not None:
        coeff = logp_all.add_(entropy[:, None]).mul_(g_entropy[:, None])
        if g_logp is not None:
            coeff.add_(g_logp[:, None])
    elif g_logp is not None:
        coeff = g_logp[:, None].expand_as(p)
    else:
        coeff = torch.zeros_like(p)
    dz = p.mul_(coeff).neg_()
    del coeff, logp_all
    if g_logp is not None:
        rows = torch.arange(dz.shape[0], device=dz.device)
        dz.index_put_((rows, targets), g_logp, accumulate=True)
    if temperature != 1.0:
        dz.div_(temperature)
    return dz


def chunked_logprobs(hidden: Tensor, weight: Tensor, bias: Tensor | None, targets: Tensor, *,
                     temperature: float, chunk: int,
                     weight_grad: GradSink | None = None) -> tuple[Tensor, Tensor]:
    """``(log p(y), H)`` in float32 of every row of ``hidden`` under
    ``softmax((hidden W^T + b) / temperature)``, with gradients for ``hidden``,
    ``weight`` and ``bias``, in ``O(chunk x vocabulary)`` memory.

    ``weight_grad``: the output layer's weight gradient is added into the
    tensor it returns (the step's float32 accumulator) instead of being handed
    to autograd - so a micro-batch never holds a ``[vocabulary, hidden]``
    gradient of its own beside the accumulated one (with tied embeddings, the
    embedding's gradient is then the only one autograd adds). None: through
    autograd, like any other function.
    """
    return ChunkedLogprobs.apply(hidden, weight, bias, targets, temperature, chunk, weight_grad)


def full_logprobs(logits: Tensor, positions: Tensor, targets: Tensor, *,
                  temperature: float) -> tuple[Tensor, Tensor]:
    """The same from the logits of a whole micro-batch ``[rows, L, V]``, as the
    trainer computed them before the chunked head: log-softmax over every
    position in float32, then the completion tokens picked out. Memory
    ``O(rows x L x vocabulary)``: the fallback for models whose output is not one
    linear layer over the last hidden state, and the reference the chunked head
    is tested and benchmarked against."""
    logp_all = torch.log_softmax(logits.float() / temperature, dim=-1).flatten(0, 1)
    # index_select with a host-made index, not a boolean mask: no device sync.
    picked = logp_all.index_select(0, positions)
    chosen = picked.gather(-1, targets[:, None])[:, 0]
    return chosen, -(picked.exp() * picked).sum(-1)
