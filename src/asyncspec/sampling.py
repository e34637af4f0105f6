"""Choosing the next token from float32 logits: the backend's greedy rule or seeded sampling.

Two ways to sample:
- sequential: one generator draws every token in turn (the serial methods' Leviathan/Chen sampling);
- positional: the token at output position p is the inverse-CDF draw of a uniform keyed by (seed, p).
  Every method then samples the same token at the same position from the same logits, so a
  speculative method that accepts a candidate exactly when it equals the target's draw follows
  the target's law and gives target-only's sample token for token (long-form temperature fallback).
"""

from __future__ import annotations

import torch

from asyncspec.models.base import Decoder
from asyncspec.shaping import nucleus

POSITION_STRIDE = 1_000_003  # seeds of distinct positions never collide for positions below it


def next_token(
    decoder: Decoder,
    logits: torch.Tensor,  # float32 [V]
    temperature: float,
    generator: torch.Generator | None,
    top_p: float = 1.0,
) -> int:
    if temperature <= 0:
        return decoder.greedy(logits)[0]
    probs = nucleus(torch.softmax(logits / temperature, dim=-1), top_p)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def positional_uniform(seed: int, position: int) -> float:
    """A uniform in [0, 1) that depends only on (seed, position)."""
    generator = torch.Generator().manual_seed(seed * POSITION_STRIDE + position)
    return float(torch.rand(1, generator=generator, dtype=torch.float64).item())


def positional_sample(logits: torch.Tensor, temperature: float, seed: int, position: int) -> int:
    """The inverse-CDF draw at `position` from softmax(logits / temperature), logits float32 [V]."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    cdf = torch.cumsum(probs, dim=0)
    index = int(torch.searchsorted(cdf, positional_uniform(seed, position) * float(cdf[-1]), right=True).item())
    if index < probs.shape[0] and probs[index] > 0:
        return index  # a likely id, so at most the last one (what the search for it below would give)
    return min(index, int(torch.nonzero(probs).max().item()))  # rounding at the top never picks a masked id


def decide(decoder: Decoder, logits: torch.Tensor, temperature: float, seed: int, first_position: int) -> list[int]:
    """Positional decisions for rows of logits [n, V], row i at output position first_position + i."""
    if temperature <= 0:
        return decoder.greedy(logits)
    return [positional_sample(logits[i], temperature, seed, first_position + i) for i in range(logits.shape[0])]


def token_logprob(logits: torch.Tensor, token: int) -> float:
    """log p(token) under the masked, unscaled logits float32 [V] (Whisper's avg_logprob), computed
    on a contiguous copy so the value never depends on where the row sat in its call."""
    return float(torch.log_softmax(logits.clone(), dim=-1)[token].item())
