"""What one training step of a config will hold at its peak, before any weight exists.

``asyncrl validate`` prints it. The model state is counted from the parameters
(in the policy's dtype, float32 master copies of low-precision trainable ones,
float32 gradient accumulators, two float32 AdamW moments per trainable
parameter). The rest - activations per token, the loss head's chunk, and the
peak of a micro-batch at the token budget - is not a formula: it is a dry run of
the trainer's own step on the ``meta`` device, traced with
:class:`~asyncrl.trainers.memory.LiveTensorBytes` (no memory, no compute, about a
second), so it follows the configured model, LoRA and checkpointing exactly.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from asyncrl.policy.devices import policy_dtype
from asyncrl.trainers.memory import LiveTensorBytes
from asyncrl.types import Completion, GroupResult, Prompt, Rollout

if TYPE_CHECKING:
    from asyncrl.config import PolicyConfig
    from asyncrl.tasks.tokenizer import Tokenizer
    from asyncrl.trainers.options import TrainerOptions


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes of one training step's peak, by part (see the module docstring)."""

    parameters: int
    trainable: int
    param_bytes: int
    master_bytes: int
    optimizer_bytes: int
    grad_bytes: int
    activation_bytes_per_token: float
    loss_chunk_tokens: int
    loss_chunk_bytes: int
    micro_batch_tokens: int
    #: Traced peak of a micro-batch of ``micro_batch_tokens`` completion tokens
    #: over the model state: gradients, activations and the loss chunk.
    micro_batch_peak_bytes: int
    peak_bytes: int
    device: str
    device_bytes: int | None

    @property
    def exceeds_device(self) -> bool:
        return self.device_bytes is not None and self.peak_bytes > self.device_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "exceeds_device": self.exceeds_device}


def estimate_step_memory(policy: PolicyConfig, options: TrainerOptions,
                         tokenizer: Tokenizer) -> MemoryEstimate:
    """The estimate for the trainer of ``options`` over the model of ``policy``
    (``tokenizer``: the policy's, which gives a from-scratch model its vocabulary)."""
    from asyncrl.policy.build import model_skeleton
    from asyncrl.trainers.grpo import GRPOTrainer

    device = torch.device(policy.device)
    # "auto" on a GPU is bfloat16 there, whatever this machine has.
    dtype = (torch.bfloat16 if policy.dtype == "auto" and device.type == "cuda"
             else policy_dtype(policy.dtype, device))
    model = model_skeleton(policy, tokenizer).to(dtype=dtype)
    trainer = GRPOTrainer.from_options(options, model=model, tokenizer=tokenizer)
    budget = options.micro_batch_tokens
    vocab = trainer.scorer.vocab_size
    try:
        with LiveTensorBytes():  # a first step creates the optimizer state
            trainer.train_chunk_sync([_rollout(1, vocab)])
            trainer.finish_step_sync()
        peaks = {tokens: _traced_step(trainer, tokens, vocab)
                 for tokens in (max(budget // 2, 1), budget)}
    finally:
        trainer._executor.shutdown(wait=False)
    (small, p_small), (large, p_large) = sorted(peaks.items())
    slope = (p_large - p_small) / (large - small) if large > small else 0.0
    params = list(model.parameters())
    trained = [p for p in trainer.params]
    count = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in trained)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    master_bytes = 4 * trainable if trainer.precision.mixed else 0
    optimizer_bytes = 8 * trainable
    chunk = min(trainer.scorer.chunk, budget)  # a micro-batch is one chunk at most
    return MemoryEstimate(
        parameters=count, trainable=trainable, param_bytes=param_bytes,
        master_bytes=master_bytes, optimizer_bytes=optimizer_bytes, grad_bytes=4 * trainable,
        activation_bytes_per_token=slope, loss_chunk_tokens=chunk,
        loss_chunk_bytes=2 * 4 * chunk * vocab if trainer.scorer.chunked else 0,
        micro_batch_tokens=budget, micro_batch_peak_bytes=p_large,
        peak_bytes=param_bytes + master_bytes + optimizer_bytes + p_large,
        device=str(device), device_bytes=device_capacity(device),
    )


def _traced_step(trainer: Any, tokens: int, vocab: int) -> int:
    """Peak bytes of a step whose one micro-batch holds ``tokens`` completion tokens."""
    with LiveTensorBytes() as meter:
        trainer.train_chunk_sync([_rollout(tokens, vocab)])
        trainer.finish_step_sync()
    return meter.peak


def _rollout(tokens: int, vocab: int) -> Rollout:
    ids = [i % vocab for i in range(3, 3 + tokens)]
    result = GroupResult(0, [0], [Completion.of(ids, [-1.0] * tokens, 0, "stop")] * 2, 0)
    return Rollout(0, Prompt(0, ""), result, [0.0, 1.0])


def device_capacity(device: torch.device) -> int | None:
    """Total memory of ``device``: the GPU's, or the host's for the CPU."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return None
        return int(torch.cuda.get_device_properties(device.index or 0).total_memory)
    if device.type == "cpu":
        try:
            text = Path("/proc/meminfo").read_text()
        except OSError:
            return None
        match = re.search(r"^MemTotal:\s+(\d+) kB", text, re.M)
        return int(match.group(1)) * 1024 if match else None
    return None


def format_bytes(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def format_count(n: float) -> str:
    """A parameter count, as :func:`format_bytes` writes bytes: one decimal of the
    largest unit it reaches (``82.3 K``, ``166.0 M``, ``1.5 B``)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f}"


def describe(est: MemoryEstimate) -> list[tuple[str, str]]:
    """``(part, value)`` rows for a table."""
    fb = format_bytes
    rows = [  # the two counts in one format: "trainable" reads against "parameters"
        ("parameters", f"{format_count(est.parameters)}, {fb(est.param_bytes)}"),
        ("trainable", format_count(est.trainable)),
    ]
    if est.master_bytes:
        rows.append(("float32 master weights", fb(est.master_bytes)))
    rows += [
        ("gradients (float32)", fb(est.grad_bytes)),
        ("optimizer (AdamW, float32)", fb(est.optimizer_bytes)),
        ("activations per token", fb(est.activation_bytes_per_token)),
        ("loss chunk", f"{est.loss_chunk_tokens} tokens, {fb(est.loss_chunk_bytes)}"),
        (f"micro-batch of {est.micro_batch_tokens} tokens (traced peak)",
         fb(est.micro_batch_peak_bytes)),
        ("step peak (estimate)", fb(est.peak_bytes)),
        (f"device {est.device}", fb(est.device_bytes) if est.device_bytes else "unknown"),
    ]
    return rows

