"""Low-precision training with float32 master weights.

The model holds its parameters in its own dtype (``policy.dtype``), and the
forward and backward passes run in it: exactly the computation the engine,
holding the same weights in the same dtype, samples with. So the on-policy
log-prob mismatch comes only from different kernels and batch shapes, not from
the trainer computing in a different precision than the engine (as it would
under autocast, whose residual stream stays float32 while the engine's is
bfloat16), and the weights sent to the engine are the very tensors the trainer
scored with (half the bytes of float32).

What must not be low precision is kept in float32:

* a float32 master copy of every low-precision parameter, which the optimizer
  (and its state) updates: bfloat16 has 8 bits of mantissa, so a small update
  ``lr * step`` to a weight would mostly round away;
* the gradient accumulated over the micro-batches and chunks of one step
  (each micro-batch's gradient is added into the master's float32 ``grad``);
* the loss arithmetic (the trainer upcasts the logits before ``log_softmax``).

After each optimizer step the masters are rounded (to nearest) into the model.
float16 also needs loss scaling (its exponent range is small): a dynamic
:class:`torch.amp.GradScaler` over the masters.

With a float32 model there are no copies: the masters *are* the parameters and
a step is the plain ``div, clip, AdamW`` of before, bit for bit.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class MasterWeights:
    """The parameters the optimizer steps, for a model with ``named_params``."""

    def __init__(self, named_params: list[tuple[str, torch.nn.Parameter]]) -> None:
        self.names = [name for name, _ in named_params]
        self.model_params = [p for _, p in named_params]
        #: What the optimizer updates: the parameter itself when float32, else a copy.
        self.master = [
            p if p.dtype == torch.float32 else torch.nn.Parameter(p.detach().float().clone())
            for p in self.model_params
        ]
        self._pairs = [(p, m) for p, m in zip(self.model_params, self.master) if p is not m]
        self._index = {id(p): i for i, p in enumerate(self.model_params)}
        fp16 = [p for p in self.model_params if p.dtype == torch.float16]
        # The loss is a sum over a chunk's tokens, not a mean: its gradients are
        # hundreds of times larger than a mean loss's, and torch's default initial
        # scale (2**16) would overflow (skip) the first ten or so steps.
        self.scaler = (torch.amp.GradScaler(fp16[0].device.type, init_scale=2.0**8)
                       if fp16 else None)

    def grad_accumulator(self, param: torch.nn.Parameter) -> Tensor | None:
        """The float32 tensor the gradient of model parameter ``param`` accumulates
        in over the step - its master's ``grad``, created as zeros - or None when
        ``param`` is not trained. A function that computes a parameter's gradient
        itself adds into it directly instead of handing it to autograd (the loss
        head does, for the output layer: see :mod:`asyncrl.trainers.loss_head`).
        Scaled like every gradient when float16 loss scaling is on."""
        index = self._index.get(id(param))
        if index is None:
            return None
        master = self.master[index]
        if master.grad is None:
            master.grad = torch.zeros_like(master)
        return master.grad

    @property
    def mixed(self) -> bool:
        """True when some parameter has a float32 master copy."""
        return bool(self._pairs)

    def backward(self, loss: Tensor) -> None:
        """Backpropagate ``loss`` and add the gradients into the masters' float32
        gradients (so many micro-batches accumulate without bf16 rounding)."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
        for p, m in self._pairs:
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.float()
            else:
                m.grad.add_(p.grad)
            p.grad = None

    def step(self, optimizer: torch.optim.Optimizer, tokens: int,
             max_norm: float | None) -> dict[str, float]:
        """Turn the accumulated gradient sum into the token mean, clip it, step the
        optimizer and round the new masters into the model. A non-finite gradient
        skips the step (one bad batch must not destroy the weights)."""
        metrics: dict[str, float] = {}
        if tokens > 0:
            for m in self.master:
                if m.grad is not None:
                    m.grad.div_(tokens)  # token-mean over the whole step
            if self.scaler is not None:
                self.scaler.unscale_(optimizer)
            clip = max_norm if max_norm is not None else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(self.master, clip))
            metrics["grad_norm"] = grad_norm
            if math.isfinite(grad_norm):
                if self.scaler is not None:
                    self.scaler.step(optimizer)
                else:
                    optimizer.step()
                self._publish()
            else:
                metrics["skipped_nonfinite_step"] = 1.0
            if self.scaler is not None:
                self.scaler.update()  # halves the scale after an overflow
                metrics["loss_scale"] = float(self.scaler.get_scale())
        optimizer.zero_grad(set_to_none=True)
        return metrics

    def _publish(self) -> None:
        with torch.no_grad():
            for p, m in self._pairs:
                p.copy_(m)

    def discard_grads(self) -> None:
        for p, _ in self._pairs:
            p.grad = None

    # ---------------------------------------------------------- checkpoints
    def state_dict(self, *, copy: bool = True) -> dict[str, Tensor]:
        """The float32 masters of the low-precision parameters on the CPU: copies,
        or (not ``copy``) the masters themselves where they are on the CPU."""
        return {name: m.detach().to("cpu", copy=copy)
                for name, p, m in zip(self.names, self.model_params, self.master) if p is not m}

    def load(self, source: dict[str, Tensor]) -> None:
        """Masters from ``source``: a :meth:`state_dict`, or a model state dict when
        the checkpoint has none (it was written by a float32 run: exact)."""
        with torch.no_grad():
            for name, p, m in zip(self.names, self.model_params, self.master):
                if p is not m:
                    m.copy_(source[name])

    def scaler_state(self) -> dict | None:
        return self.scaler.state_dict() if self.scaler is not None else None

    def load_scaler_state(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
