"""``asyncrl validate``'s memory estimate (:mod:`asyncrl.trainers.estimate`): each
row counts one thing, and the step peak is their sum.

A new user's trial read "activations per token 280.6 KiB" at one layer and
462.8 KiB at eight, 255.6 / 262.6 KiB with checkpointing: the row held the loss
chunk's growth with the micro-batch (a float32 vocabulary row or two per token)
beside the "loss chunk" row, so checkpointing looked almost useless.
"""

from __future__ import annotations

from functools import cache

import pytest

from asyncrl.config import LossConfig, PolicyConfig
from asyncrl.tasks.tokenizer import CharTokenizer
from asyncrl.trainers.estimate import MemoryEstimate, describe, estimate_step_memory
from asyncrl.trainers.options import TrainerOptions

pytest.importorskip("transformers")

HIDDEN = 64
TOKENS = 256


@cache  # a dry run takes a second or two; the tests share them
def estimate(layers: int, *, checkpointing: bool = False, vocab: int = 8000) -> MemoryEstimate:
    policy = PolicyConfig(
        model={"hidden_size": HIDDEN, "num_layers": layers, "num_heads": 4,
               "intermediate_size": 256, "vocab_size": vocab},
        train_micro_batch_tokens=TOKENS, gradient_checkpointing=checkpointing, num_threads=1)
    return estimate_step_memory(policy, TrainerOptions.of(policy, LossConfig()), CharTokenizer())


def test_activations_follow_the_layers_and_checkpointing_and_the_loss_chunk_the_vocabulary():
    plain = {n: estimate(n) for n in (1, 3, 5)}
    kept = {n: estimate(n, checkpointing=True) for n in (1, 5)}
    # Without checkpointing every layer keeps its activations: linear in the layers.
    layer = (plain[5].activation_bytes_per_token - plain[1].activation_bytes_per_token) / 4
    assert layer > 4 * 256 * 4  # at least a few float32 rows of the MLP's width per token
    between = plain[3].activation_bytes_per_token - plain[1].activation_bytes_per_token
    assert between == pytest.approx(2 * layer, rel=0.02)
    # With it a layer keeps its float32 input only (the loss chunk is the step's
    # peak here: no layer's recomputation shows).
    kept_layer = (kept[5].activation_bytes_per_token - kept[1].activation_bytes_per_token) / 4
    assert kept_layer == pytest.approx(HIDDEN * 4, rel=0.02)
    assert kept[5].activation_bytes_per_token < 0.2 * plain[5].activation_bytes_per_token
    # The loss chunk is the same whatever the layers and checkpointing: one
    # micro-batch's tokens (under the chunk size) x the vocabulary, in float32 twice.
    for est in (*plain.values(), *kept.values()):
        assert est.loss_chunk_tokens == TOKENS
        assert est.loss_chunk_bytes == 8 * TOKENS * 8000
        assert est.activation_bytes == round(est.activation_bytes_per_token * TOKENS)
    # The vocabulary moves the loss chunk (and the parameters) only.
    small = estimate(3, vocab=500)
    assert small.loss_chunk_bytes == 8 * TOKENS * 500
    assert small.activation_bytes_per_token == pytest.approx(
        plain[3].activation_bytes_per_token, rel=0.01)


def test_the_step_peak_is_the_sum_of_the_rows_and_bounds_the_traced_peak():
    for est in (estimate(3), estimate(5, checkpointing=True), estimate(3, vocab=500)):
        parts = (est.param_bytes + est.master_bytes + est.optimizer_bytes + est.grad_bytes
                 + est.activation_bytes + est.loss_chunk_bytes + est.other_bytes)
        assert est.peak_bytes == parts
        assert est.step_bytes == parts - est.param_bytes - est.master_bytes - est.optimizer_bytes
        assert est.micro_batch_peak_bytes <= est.step_bytes
        # At the loss head a step holds all of them at once: the sum is the traced peak.
        assert est.micro_batch_peak_bytes >= 0.98 * est.step_bytes
        rows = dict(describe(est))
        assert ("activations (checkpointed)" in rows) == est.checkpointing
        assert "step peak (sum: an upper bound)" in rows
