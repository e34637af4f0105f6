"""Verification math: greedy chains, and the distribution emitted by stochastic verification."""

from __future__ import annotations

import pytest
import torch

from asyncspec import verify
from asyncspec.verify import greedy_verify, residual, speculative_accept

P = torch.tensor([0.40, 0.30, 0.10, 0.10, 0.05, 0.05])
Q = torch.tensor([0.10, 0.10, 0.30, 0.30, 0.10, 0.10])
DRAWS = 100_000
# Expected TV of an empirical distribution from DRAWS samples is about sum_i sqrt(p_i / (2 pi N))
# ~ 0.004 here; 0.01 leaves room for the seed while a wrong rule (TV 0.15 below) fails by far.
NOISE_FLOOR_TV = 0.01


def test_greedy_verify_accepts_the_matching_prefix():
    assert greedy_verify([5, 6, 7, 8], [5, 6, 7]) == verify.Verdict(3, 8)  # all accepted + bonus
    assert greedy_verify([5, 9, 7, 8], [5, 6, 7]) == verify.Verdict(1, 9)  # recovered at position 1
    assert greedy_verify([4], []) == verify.Verdict(0, 4)
    with pytest.raises(ValueError):
        greedy_verify([1, 2], [1, 2])


def _emitted_first_tokens(rule) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1234)
    counts = torch.zeros(len(P))
    for _ in range(DRAWS):
        candidate = int(torch.multinomial(Q, 1, generator=generator))
        verdict = rule(torch.stack([P, P]), Q[None], [candidate], generator)
        counts[candidate if verdict.accepted else verdict.next_token] += 1
    return counts / DRAWS


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a - b).abs().sum().item()


def test_stochastic_verification_emits_the_target_distribution():
    assert _tv(_emitted_first_tokens(speculative_accept), P) < NOISE_FLOOR_TV


def test_a_wrong_residual_fails_the_same_test(monkeypatch):
    monkeypatch.setattr(verify, "residual", lambda p, q: p)  # sample from p instead of [p - q]+
    tv = _tv(_emitted_first_tokens(verify.speculative_accept), P)
    assert tv > 10 * NOISE_FLOOR_TV


def test_bonus_after_full_acceptance_is_drawn_from_the_next_target_row():
    generator = torch.Generator().manual_seed(7)
    shifted = torch.roll(P, 2)
    counts = torch.zeros(len(P))
    for _ in range(20_000):
        verdict = speculative_accept(torch.stack([P, shifted]), P[None], [0], generator)  # q = p: always accepted
        assert verdict.accepted == 1
        counts[verdict.next_token] += 1
    assert _tv(counts / counts.sum(), shifted) < 0.02


def test_residual_is_normalised_positive_part():
    r = residual(P, Q)
    assert torch.allclose(r, torch.tensor([0.3, 0.2, 0, 0, 0, 0]) / 0.5)
    assert torch.equal(residual(P, P), P)
