"""Choosing the next token from float32 logits: the backend's greedy rule or seeded sampling."""

from __future__ import annotations

import torch

from asyncspec.models.base import Decoder


def next_token(
    decoder: Decoder,
    logits: torch.Tensor,  # float32 [V]
    temperature: float,
    generator: torch.Generator | None,
) -> int:
    if temperature <= 0:
        return decoder.greedy(logits)[0]
    probs = torch.softmax(logits / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


def make_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
