"""The distribution the engine samples from, and sampling from it on the device.

Everything here is tensor arithmetic on the logits' device: no value ever goes
to the host, so a decoding step never waits for the GPU.
"""

from __future__ import annotations

import torch


def sampling_logprobs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs ``[rows, vocab]`` of the distribution the engine samples from.

    ``softmax(logits / temperature)``, then, when ``top_p < 1``, only the
    smallest set of most likely tokens whose mass reaches ``top_p`` is kept
    (a token stays if the mass of the tokens ranked above it is below
    ``top_p``, so the top token always stays) and the rest get ``-inf``;
    the kept ones are renormalised to sum to one.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_logp, order = logp.sort(dim=-1, descending=True)
    sorted_p = sorted_logp.exp()
    drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


def sample_tokens(
    logits: torch.Tensor, temperature: float, top_p: float, rng: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row and its behavior log-prob, both on the logits' device.

    ``temperature == 0`` is greedy: the argmax, with log-prob 0 (probability one).
    Otherwise a draw from :func:`sampling_logprobs`'s distribution by the
    exponential race: ``argmax(p / E)`` with ``E ~ Exp(1)`` i.i.d. picks token
    ``i`` with probability ``p_i``. It is what ``torch.multinomial`` computes for
    one sample (same draws from ``rng``, same tokens), without the validity
    checks that read the probabilities back to the host at every call.
    Non-finite logits are caught later, from the log-probs, when the group ends.
    """
    if temperature == 0:
        return logits.argmax(dim=-1), torch.zeros(logits.shape[0], device=logits.device)
    logp = sampling_logprobs(logits, temperature, top_p)
    probs = logp.exp()
    race = torch.empty_like(probs).exponential_(1.0, generator=rng)
    tokens = (probs / race).argmax(dim=-1)
    return tokens, logp.gather(1, tokens[:, None])[:, 0]
