"""The positional sampler (sampling.positional_sample): its shortcut (an id of positive probability
is returned without searching for the last such id) draws what the full inverse-CDF rule draws,
at every temperature, position and masking tried; at the top of the CDF, where rounding lands the
search past the last likely id, it still never returns a masked id. The control: the search alone
returns one there."""

from __future__ import annotations

import math

import pytest
import torch

from asyncspec import sampling


def full_rule(logits: torch.Tensor, temperature: float, seed: int, position: int) -> int:
    """The inverse-CDF draw, always clamped to the last id of positive probability."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    cdf = torch.cumsum(probs, dim=0)
    target = sampling.positional_uniform(seed, position) * float(cdf[-1])
    index = int(torch.searchsorted(cdf, target, right=True).item())
    return min(index, int(torch.nonzero(probs).max().item()))


def masked_logits(seed: int, size: int = 2000) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(size, generator=generator) * 4
    logits[torch.rand(size, generator=generator) < 0.3] = -math.inf  # suppressed ids, anywhere
    logits[-50:] = -math.inf  # and a masked tail, as Whisper's rules leave one
    return logits


@pytest.mark.parametrize("temperature", [0.2, 0.6, 1.0])
def test_the_shortcut_draws_what_the_full_rule_draws(temperature):
    for seed in range(4):
        logits = masked_logits(seed)
        for position in range(60):
            drawn = sampling.positional_sample(logits, temperature, seed, position)
            assert drawn == full_rule(logits, temperature, seed, position)
            assert logits[drawn] > -math.inf


def test_at_the_top_of_the_cdf_no_masked_id_is_drawn(monkeypatch):
    logits = masked_logits(7)
    monkeypatch.setattr(sampling, "positional_uniform", lambda seed, position: 1.0)  # u * total = total
    probs = torch.softmax(logits.double(), dim=-1)
    cdf = torch.cumsum(probs, dim=0)
    searched = int(torch.searchsorted(cdf, float(cdf[-1]), right=True).item())
    assert searched >= len(logits) - 50  # the control: the search alone lands in the masked tail
    drawn = sampling.positional_sample(logits, 1.0, 0, 0)
    assert drawn == int(torch.nonzero(probs).max().item()) and logits[drawn] > -math.inf
