"""What one training step of a config will hold at its peak, before any weight exists.

``asyncrl validate`` prints it. The model state is counted from the parameters
(in the policy's dtype, float32 master copies of low-precision trainable ones,
float32 gradient accumulators, two float32 AdamW moments per trainable
parameter), the loss chunk from its size (two float32 ``[chunk, vocabulary]``
tensors). The rest is not a formula: it is a dry run of the trainer's own step
on the ``meta`` device, traced with :class:`~asyncrl.trainers.memory.LiveTensorBytes`
(no memory, no compute, a second or two), so it follows the configured model,
LoRA and checkpointing exactly. Activations per token are the difference of two
traced steps whose loss head works on chunks of one size (so that the loss
chunk, which grows with a micro-batch shorter than it, stays out of them); what the
traced peak holds beyond gradients, activations and the loss chunk is "other".
The parts are disjoint and the step peak is their sum: an upper bound, as if
all were held at once (a step holds them together at its loss head).
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
    """Bytes of one training step's peak, by part (see the module docstring).

    The parts are disjoint and :attr:`peak_bytes` is their sum: the model state
    (``param_bytes``, ``master_bytes``, ``optimizer_bytes``), which exists before
    a step, and what a step allocates at its peak (``grad_bytes``,
    ``activation_bytes``, ``loss_chunk_bytes``, ``other_bytes``).
    """

    parameters: int
    trainable: int
    param_bytes: int
    master_bytes: int
    optimizer_bytes: int
    grad_bytes: int
    #: What a micro-batch's peak grows by per completion token, the loss head
    #: held fixed: the decoder's activations (with checkpointing: the hidden
    #: state kept per layer, and a layer's recomputation where that is the peak).
    activation_bytes_per_token: float
    #: ``activation_bytes_per_token`` times ``micro_batch_tokens``.
    activation_bytes: int
    checkpointing: bool
    loss_chunk_tokens: int
    #: The loss head's working set: float32 ``[loss_chunk_tokens, vocabulary]``
    #: tensors (0: no chunked head; the full logits are then per-token activations).
    loss_chunk_bytes: int
    #: The traced peak beyond gradients, activations and the loss chunk: what
    #: does not grow with tokens (masks, the optimizer step's temporaries), 0 when
    #: those three were not all held at once.
    other_bytes: int
    micro_batch_tokens: int
    #: The traced peak of a step with a micro-batch of ``micro_batch_tokens``
    #: completion tokens, over the model state: at most the sum of the four
    #: parts above (equal when they are held at once, at the loss head).
    micro_batch_peak_bytes: int
    peak_bytes: int
    device: str
    device_bytes: int | None

    @property
    def step_bytes(self) -> int:
        """What a step allocates over the model state: an upper bound of
        ``train/peak_memory_bytes`` on the CPU (its resident growth)."""
        return self.grad_bytes + self.activation_bytes + self.loss_chunk_bytes + self.other_bytes

    @property
    def exceeds_device(self) -> bool:
        return self.device_bytes is not None and self.peak_bytes > self.device_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "step_bytes": self.step_bytes,
                "exceeds_device": self.exceeds_device}


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
    scorer = trainer.scorer
    vocab = scorer.vocab_size
    chunk = min(scorer.chunk, budget)  # a micro-batch is one chunk at most
    half = max(budget // 2, 1)
    try:
        with LiveTensorBytes():  # a first step creates the optimizer state
            trainer.train_chunk_sync([_rollout(1, vocab)])
            trainer.finish_step_sync()
        peak = _traced_step(trainer, budget, vocab)
        # Two steps whose loss head works on chunks of one size differ by what
        # grows with tokens only: the activations. (With the configured chunk,
        # a micro-batch shorter than it has a loss chunk that grows with it too.)
        configured, scorer.chunk = scorer.chunk, min(chunk, half)
        try:
            high = peak if scorer.chunk == chunk else _traced_step(trainer, budget, vocab)
            low = _traced_step(trainer, half, vocab) if half < budget else high
        finally:
            scorer.chunk = configured
    finally:
        trainer._executor.shutdown(wait=False)
    per_token = (high - low) / (budget - half) if budget > half else 0.0
    params = list(model.parameters())
    trainable = sum(p.numel() for p in trainer.params)
    param_bytes = sum(p.numel() * p.element_size() for p in params)
    master_bytes = 4 * trainable if trainer.precision.mixed else 0
    grad_bytes = 4 * trainable
    activation_bytes = round(per_token * budget)
    loss_chunk_bytes = _loss_chunk_bytes(chunk, vocab) if scorer.chunked else 0
    other = max(peak - grad_bytes - activation_bytes - loss_chunk_bytes, 0)
    state = param_bytes + master_bytes + 8 * trainable
    return MemoryEstimate(
        parameters=sum(p.numel() for p in params), trainable=trainable,
        param_bytes=param_bytes, master_bytes=master_bytes, optimizer_bytes=8 * trainable,
        grad_bytes=grad_bytes, activation_bytes_per_token=per_token,
        activation_bytes=activation_bytes, checkpointing=options.gradient_checkpointing,
        loss_chunk_tokens=chunk, loss_chunk_bytes=loss_chunk_bytes, other_bytes=other,
        micro_batch_tokens=budget, micro_batch_peak_bytes=peak,
        peak_bytes=state + grad_bytes + activation_bytes + loss_chunk_bytes + other,
        device=str(device), device_bytes=device_capacity(device),
    )


def _loss_chunk_bytes(chunk: int, vocab: int) -> int:
    """The loss head's peak for one chunk (:mod:`asyncrl.trainers.loss_head`): two
    float32 ``[chunk, vocabulary]`` tensors at once (the log-softmax and its
    exponential), whatever the model's dtype."""
    return 8 * chunk * vocab


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
    """``(part, value)`` rows for a table: each part once, and the step peak
    their sum (see :data:`NOTE`)."""
    fb = format_bytes
    rows = [  # the two counts in one format: "trainable" reads against "parameters"
        ("parameters", f"{format_count(est.parameters)}, {fb(est.param_bytes)}"),
        ("trainable", format_count(est.trainable)),
    ]
    if est.master_bytes:
        rows.append(("float32 master weights", fb(est.master_bytes)))
    kept = "checkpointed" if est.checkpointing else "no checkpointing"
    head = (f"{est.loss_chunk_tokens} tokens, {fb(est.loss_chunk_bytes)}" if est.loss_chunk_bytes
            else "none (full logits: in the activations)")
    rows += [
        ("optimizer (AdamW, float32)", fb(est.optimizer_bytes)),
        ("gradients (float32)", fb(est.grad_bytes)),
        (f"activations ({kept})", f"{fb(est.activation_bytes_per_token)} per token, "
                                  f"{fb(est.activation_bytes)} at {est.micro_batch_tokens}"),
        ("loss chunk", head),
        ("other (traced, not per token)", fb(est.other_bytes)),
        ("step peak (sum: an upper bound)", fb(est.peak_bytes)),
        (f"device {est.device}", fb(est.device_bytes) if est.device_bytes else "unknown"),
    ]
    return rows


#: What the table's step peak is, printed under it.
NOTE = ("The step peak adds every part as if all were held at once: a step holds "
        "its gradients, activations and one loss chunk together at its loss head, "
        "frees the chunk before the layers' backward pass and the activations "
        "before the optimizer step. On the CPU, train/peak_memory_bytes is the "
        "step's resident growth: at most the parts from the gradients on (the model "
        "state exists before the step), less what earlier steps freed and the "
        "allocator kept for reuse.")
