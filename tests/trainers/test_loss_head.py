"""The chunked loss head, token-budget micro-batches and per-token loss weights:
exactly the gradient of the full-vocabulary path, however the step is cut."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
import torch
from tests.trainers.shapes import TOKENIZER, small_policy, synthetic_rollouts

from asyncrl.config import LossConfig
from asyncrl.trainers import GRPOTrainer
from asyncrl.trainers.loss_head import chunk_tokens, chunked_logprobs, full_logprobs
from asyncrl.trainers.packing import plan_micro_batches
from asyncrl.types import Completion

pytest.importorskip("transformers")

VOCAB = 300
#: Completions of uneven lengths: several micro-batches, padding, and loss
#: chunks (of 7 tokens below) that cut through rows.
LENGTHS = [[9, 3, 14, 6], [11, 11, 2, 8], [5, 16, 7, 1]]


def trainer(*, seed: int = 0, **kw) -> GRPOTrainer:
    model, tok = small_policy(seed)
    kw.setdefault("micro_batch_tokens", 64)
    kw.setdefault("loss_chunk_tokens", 7)
    return GRPOTrainer(model, tok, num_threads=1, **kw)


def grads(t: GRPOTrainer) -> torch.Tensor:
    return torch.cat([(m.grad if m.grad is not None else torch.zeros_like(m)).flatten()
                      for m in t.params])


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


# ------------------------------------------------------------ exactness
CASES = list(itertools.product(["none", "tis", "decoupled"], [0.0, 0.05], [0.0, 0.01]))


@pytest.mark.parametrize(("correction", "kl_coef", "entropy_coef"), CASES)
def test_chunked_head_gives_the_full_vocabulary_gradient(correction, kl_coef, entropy_coef):
    """Every loss option, float32: the same metrics and a gradient within 1e-6
    relative of the path that materialises [tokens x vocabulary] log-probs."""
    loss = LossConfig(off_policy_correction=correction, kl_coef=kl_coef,
                      entropy_coef=entropy_coef, clip_eps=0.1)
    data = synthetic_rollouts(LENGTHS, vocab=VOCAB)
    # One padded micro-batch of all twelve completions (micro-batching has tests of
    # its own below); the loss chunks of 7 tokens cut through its rows.
    full = trainer(loss=loss, full_vocab_loss=True, micro_batch_tokens=10_000)
    chunked = trainer(loss=loss, micro_batch_tokens=10_000)
    assert chunked.scorer.chunked and not full.scorer.chunked
    if kl_coef:  # a reference that differs from the policy
        for t in (full, chunked):
            with torch.no_grad():
                for p in t.model.parameters():
                    p.mul_(1.01)
    m_full, m_chunked = full.train_chunk_sync(data), chunked.train_chunk_sync(data)
    assert rel(grads(chunked), grads(full)) < 1e-6
    for key, value in m_full.items():
        assert m_chunked[key] == pytest.approx(value, rel=1e-5, abs=1e-7), key
    if correction == "none":
        assert m_full["clip_frac"] > 0  # the clip binds on some tokens
    s_full, s_chunked = full.finish_step_sync(), chunked.finish_step_sync()
    assert s_chunked["loss"] == pytest.approx(s_full["loss"], rel=1e-5)


def test_head_function_matches_autograd_with_a_bias_and_a_temperature():
    torch.manual_seed(0)
    h = torch.randn(23, 16, requires_grad=True)
    w = torch.randn(50, 16, requires_grad=True)
    b = torch.randn(50, requires_grad=True)
    y = torch.randint(0, 50, (23,))
    g_logp, g_ent = torch.randn(23), torch.randn(23)
    lp, ent = chunked_logprobs(h, w, b, y, temperature=0.7, chunk=5)
    got = torch.autograd.grad((lp * g_logp).sum() + (ent * g_ent).sum(), (h, w, b))
    lp2, ent2 = full_logprobs((h @ w.T + b)[None], torch.arange(23), y, temperature=0.7)
    want = torch.autograd.grad((lp2 * g_logp).sum() + (ent2 * g_ent).sum(), (h, w, b))
    assert torch.allclose(lp, lp2, atol=1e-5) and torch.allclose(ent, ent2, atol=1e-5)
    for a, e in zip(got, want):
        assert rel(a, e) < 1e-6


def test_chunk_size_follows_the_vocabulary():
    assert chunk_tokens(151936) == 441  # 256 MiB of float32 logits per chunk
    assert chunk_tokens(20) > 10**6  # a toy vocabulary: one chunk
    assert chunk_tokens(10**9) == 1


def test_gradient_checkpointing_is_exact():
    data = synthetic_rollouts(LENGTHS, vocab=VOCAB)
    plain, checkpointed = trainer(), trainer(gradient_checkpointing=True)
    assert any(getattr(m, "gradient_checkpointing", False) for m in checkpointed.model.modules())
    assert not any(m.training for m in checkpointed.model.modules()
                   if not getattr(m, "gradient_checkpointing", False))  # no dropout anywhere
    plain.train_chunk_sync(data)
    checkpointed.train_chunk_sync(data)
    assert rel(grads(checkpointed), grads(plain)) < 1e-6


# --------------------------------------------------------- micro-batches
def test_micro_batches_are_length_sorted_within_the_token_budget():
    lengths = [10, 3, 30, 9, 12, 4, 11]
    plan = plan_micro_batches(lengths, 36)
    assert sorted(i for rows in plan for i in rows) == list(range(len(lengths)))
    for rows in plan:
        widths = [lengths[i] for i in rows]
        assert widths == sorted(widths, reverse=True)
        assert len(rows) == 1 or len(rows) * widths[0] <= 36
    assert plan[0] == [2]  # 30 tokens: alone
    assert plan == [[2], [4, 6, 0], [3, 5, 1]]
    assert plan_micro_batches([50], 10) == [[0]]  # longer than the budget: alone


def test_the_budget_changes_passes_and_padding_not_the_step():
    data = synthetic_rollouts(LENGTHS, vocab=VOCAB)
    results = []
    for budget in (10_000, 64, 16):
        t = trainer(micro_batch_tokens=budget)
        passes = t.plan_passes(data)
        t.train_chunk_sync(data)
        g = grads(t)
        step = t.finish_step_sync()
        assert step["micro_batches"] == passes
        results.append((passes, step["pad_frac"], step["loss"], g))
    (p0, pad0, loss0, g0), *rest = results
    assert p0 == 1 and 1 < rest[0][0] < rest[1][0]
    assert pad0 > 0.3 and all(pad < pad0 / 2 for _, pad, *_ in rest)  # sorted by length
    for _, _, loss, g in rest:
        assert loss == pytest.approx(loss0, rel=1e-5)
        assert rel(g, g0) < 1e-5


def test_idle_passes_change_nothing_and_too_few_passes_are_refused():
    data = synthetic_rollouts(LENGTHS, vocab=VOCAB)
    plain, padded = trainer(), trainer()
    plain.train_chunk_sync(data)
    needed = padded.plan_passes(data)
    padded.train_chunk_sync(data, passes=needed + 3)
    assert torch.equal(grads(padded), grads(plain))
    step = padded.finish_step_sync()
    assert step["micro_batches"] == needed + 3
    assert step["step_tokens"] == sum(map(sum, LENGTHS))
    with pytest.raises(ValueError, match="needs"):
        trainer().train_chunk_sync(data, passes=needed - 1)


# ------------------------------------------------------------ loss weights
def test_tokens_of_weight_zero_neither_train_nor_count():
    """A completion whose tokens all have loss weight 0 (the record's
    ``loss_mask``) gives exactly the step of the data without it (same
    advantages): no gradient, no share of the mean."""
    data = synthetic_rollouts(LENGTHS, vocab=VOCAB)
    dropped = synthetic_rollouts(LENGTHS, vocab=VOCAB)
    masked_out = dropped[1].result.completions[2]
    data[1].result.completions[2] = dataclasses.replace(masked_out,
                                                        loss_mask=[0] * len(masked_out))
    dropped[1].result.completions[2] = Completion.of([], [], 0, "stop")  # flatten skips it
    weighted, reference = trainer(), trainer()
    m_weighted = weighted.train_chunk_sync(data)
    m_reference = reference.train_chunk_sync(dropped)
    assert rel(grads(weighted), grads(reference)) < 1e-6
    for key in ("loss", "logprob_mismatch", "entropy", "clip_frac", "is_ess"):
        assert m_weighted[key] == pytest.approx(m_reference[key], rel=1e-5), key
    s_weighted, s_reference = weighted.finish_step_sync(), reference.finish_step_sync()
    assert s_weighted["step_tokens"] == s_reference["step_tokens"] \
        == sum(map(sum, LENGTHS)) - len(masked_out)
    assert s_weighted["loss"] == pytest.approx(s_reference["loss"], rel=1e-5)


def test_step_token_count_is_the_one_normaliser():
    """A data-parallel wrapper overrides it with the global count: the update
    then is the local gradient sum over the global token count."""
    data = synthetic_rollouts(LENGTHS, vocab=VOCAB)

    class TwiceTheTokens(GRPOTrainer):
        def step_token_count(self, local: float) -> float:
            return 2 * local

    model, tok = small_policy()
    halved = TwiceTheTokens(model, tok, num_threads=1, optimizer=None)
    plain = trainer()
    for t in (halved, plain):
        t.train_chunk_sync(data)
    g_plain = grads(plain)
    step = halved.finish_step_sync()
    plain_step = plain.finish_step_sync()
    assert step["step_tokens"] == 2 * plain_step["step_tokens"]
    assert step["grad_norm"] == pytest.approx(plain_step["grad_norm"] / 2, rel=1e-5)
    assert g_plain.norm() > 0


def test_tokenizer_ids_beyond_the_tokenizer_are_scored():
    """The vocabulary knob gives the output layer more rows than the tokenizer
    has ids: sampled ids up there train like any other."""
    model, _ = small_policy()
    assert model.get_output_embeddings().weight.shape[0] == VOCAB > TOKENIZER.vocab_size
