"""The memory of a training step on the Qwen2-shaped model (2 layers, 151,936 ids).

Measured with :class:`~asyncrl.trainers.memory.LiveTensorBytes` on the meta
device: the peak of the bytes of live tensors the step allocated, counted
operator by operator - deterministic (no allocator, no other process, no load of
this shared machine in it) and without computing anything, so a step of a
real-sized model takes a fraction of a second. What it does not see (kernel
scratch space, the allocator's caching) does not grow with tokens x vocabulary.
The step measured is a model's second (the optimizer state exists, as in every
step of a run); its peak is the growth over what the process held before it.
"""

from __future__ import annotations

import pytest
import torch
from tests.trainers.shapes import (
    QWEN2_2_LAYERS,
    SMALL_QWEN2,
    TOKENIZER,
    meta_model,
    small_policy,
    synthetic_rollouts,
)

from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.memory import LiveTensorBytes, StepPeakMemory

pytest.importorskip("transformers")

VOCAB = QWEN2_2_LAYERS.vocab_size
PROMPT = 64
MiB = 2**20


def step_peaks(completions: list[int], budget: int, **trainer_kw) -> tuple[int, int]:
    """(peak of the forward/backward passes, peak of the whole step) of one step
    on ``completions`` (their lengths) in micro-batches of ``budget`` tokens."""
    trainer = GRPOTrainer(meta_model(), TOKENIZER, micro_batch_tokens=budget, **trainer_kw)
    with LiveTensorBytes():  # the first step creates the optimizer state
        trainer.train_chunk_sync(synthetic_rollouts([[4]], vocab=VOCAB, prompt_len=PROMPT))
        trainer.finish_step_sync()
    data = synthetic_rollouts([completions], vocab=VOCAB, prompt_len=PROMPT, seed=1)
    with LiveTensorBytes() as meter:
        trainer.train_chunk_sync(data)
        passes = meter.peak
        trainer.finish_step_sync()
    return passes, meter.peak


def test_peak_is_flat_in_the_number_of_micro_batches():
    """A fixed token budget, four times the data (1 -> 4 micro-batches): the step's
    peak grows by at most 10%. Nothing is kept per micro-batch. During the passes
    alone, what the later micro-batches hold beyond the first one's is exactly the
    decoder layers' gradient accumulators (the first micro-batch creates them in
    its backward pass; the output layer's exists from its start)."""
    budget = PROMPT + 1 + 512
    one_passes, one = step_peaks([512], budget)
    four_passes, four = step_peaks([512] * 4, budget)
    assert four <= 1.10 * one, (four / MiB, one / MiB)
    model = meta_model()
    head = model.get_output_embeddings().weight
    layer_grads = sum(4 * p.numel() for p in model.parameters() if p is not head)
    assert 0 <= four_passes - one_passes <= 1.05 * layer_grads, (
        (four_passes - one_passes) / MiB, layer_grads / MiB)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_peak_grows_linearly_in_tokens_without_a_vocabulary_term(checkpointing):
    """512 -> 2,048 completion tokens in one micro-batch: the peak grows by the
    activations per token only - less than one float32 row of the vocabulary
    (4 x 151,936 bytes) per token; the full-vocabulary path grows by several."""
    kw = {"gradient_checkpointing": checkpointing}
    small, _ = step_peaks([512], 4096, **kw)
    large, _ = step_peaks([2048], 4096, **kw)
    slope = (large - small) / 1536
    vocab_row = 4 * VOCAB
    assert 0 < slope < 0.75 * vocab_row, slope
    if checkpointing:  # one layer's activations recomputed at a time
        assert slope < 0.25 * vocab_row, slope
    full_small, _ = step_peaks([512], 4096, full_vocab_loss=True)
    full_large, _ = step_peaks([2048], 4096, full_vocab_loss=True)
    assert (full_large - full_small) / 1536 > 3 * vocab_row
    assert small < 0.6 * full_small and large < 0.3 * full_large


def test_the_meter_sees_on_meta_what_a_cpu_step_allocates():
    """The same step, computed on the CPU and traced on the meta device: the
    peaks agree (attention, data-dependent checks and all)."""
    data = synthetic_rollouts([[30, 20, 25]], vocab=SMALL_QWEN2.vocab_size, prompt_len=PROMPT)
    peaks = []
    for model in (small_policy()[0], meta_model(SMALL_QWEN2)):
        trainer = GRPOTrainer(model, TOKENIZER, micro_batch_tokens=200, loss_chunk_tokens=16,
                              num_threads=1)
        with LiveTensorBytes() as meter:
            trainer.train_chunk_sync(data)
        peaks.append(meter.peak)
    cpu, meta = peaks
    assert meta == pytest.approx(cpu, rel=0.05), (cpu, meta)


def test_each_step_reports_its_peak():
    model, tok = small_policy()
    trainer = GRPOTrainer(model, tok, num_threads=1)
    trainer.train_chunk_sync(synthetic_rollouts([[8, 8]], vocab=SMALL_QWEN2.vocab_size))
    step = trainer.finish_step_sync()
    assert step["peak_memory_bytes"] >= 0
    meter = StepPeakMemory(torch.device("cpu"))
    meter.start()
    held = torch.ones(64 * MiB // 4)  # 64 MiB, touched
    peak = meter.stop()
    del held
    assert peak is not None and peak >= 60 * MiB
    assert meter.stop() is None  # not started
