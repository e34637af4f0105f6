"""Verification math, free of models and I/O. Reused by every speculative method and the cloud.

Vocabulary (as in vLLM's rejection sampler): of n candidates after a known root, the first
`accepted` match the target; then either a *recovered* token replaces the first rejected
candidate, or, when all n are accepted, a *bonus* token follows them. Either way exactly one
target token is produced beyond the accepted ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    accepted: int  # leading candidates the target agrees with
    next_token: int  # the recovered token (rejection) or the bonus token (all accepted)


def greedy_verify(
    target_choices: Sequence[int],  # [n + 1] the target's greedy token after root, c1, ..., cn
    candidates: Sequence[int],  # [n]
) -> Verdict:
    """Accept while each candidate equals the target's choice; then the target's own token."""
    if len(target_choices) != len(candidates) + 1:
        raise ValueError(f"{len(target_choices)} target choices for {len(candidates)} candidates")
    accepted = 0
    while accepted < len(candidates) and candidates[accepted] == target_choices[accepted]:
        accepted += 1
    return Verdict(accepted, int(target_choices[accepted]))


def residual(
    p: torch.Tensor,  # [V] target probabilities at the rejected position
    q: torch.Tensor,  # [V] drafter probabilities at that position
) -> torch.Tensor:  # [V] normalised [p - q]+
    """The distribution to sample from after a rejection; p itself if p == q (nothing left)."""
    excess = torch.clamp(p - q, min=0.0)
    total = excess.sum()
    return excess / total if total > 0 else p


def speculative_accept(
    p: torch.Tensor,  # [n + 1, V] target probabilities after root, c1, ..., cn
    q: torch.Tensor,  # [n, V] drafter probabilities the candidates were sampled from
    candidates: Sequence[int],  # [n]
    generator: torch.Generator | None = None,
) -> Verdict:
    """Leviathan et al. / Chen et al.: accept c_i with probability min(1, p_i(c_i) / q_i(c_i));
    at the first rejection sample from the residual; after full acceptance sample a bonus from p_n.
    The emitted tokens are distributed exactly as if sampled from p one by one."""
    n = len(candidates)
    if p.shape[0] != n + 1 or q.shape[0] != n:
        raise ValueError(f"p has {p.shape[0]} rows and q {q.shape[0]} for {n} candidates")
    for i, token in enumerate(candidates):
        ratio = p[i, token] / q[i, token] if q[i, token] > 0 else torch.tensor(0.0)
        if torch.rand((), generator=generator) >= ratio:
            recovered = torch.multinomial(residual(p[i], q[i]), 1, generator=generator)
            return Verdict(i, int(recovered.item()))
    bonus = torch.multinomial(p[n], 1, generator=generator)
    return Verdict(n, int(bonus.item()))


def first_rejection(
    p: torch.Tensor,  # [n + 1, V] target probabilities after root, c1, ..., cn
    q_of_candidates: Sequence[float],  # [n] q_i(c_i): all a compact uplink carries of the draft
    candidates: Sequence[int],  # [n]
    generator: torch.Generator,
) -> int | None:
    """The accept test of `speculative_accept` (accept c_i with probability min(1, p_i(c_i) / q_i(c_i)),
    float64 uniforms) with only q(c_i) known: the index of the first rejected candidate, or None
    when all are accepted. Settling the rejection needs the residual [p - q]+, that is all of q,
    which stays at the edge (cloudedge/correction.py)."""
    for i, (token, q) in enumerate(zip(candidates, q_of_candidates, strict=True)):
        ratio = float(p[i, token]) / q if q > 0 else 0.0
        if float(torch.rand((), generator=generator, dtype=torch.float64)) >= ratio:
            return i
    return None


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) over the last axis, float32; suppressed (-inf) entries get 0."""
    return torch.softmax(logits.float() / temperature, dim=-1)


def tv_certificate(
    support_p: torch.Tensor,  # [K] target probabilities of the returned support S
    support_q: torch.Tensor,  # [K] draft probabilities of the same tokens
    tail: float,  # delta_p = target mass outside S
) -> tuple[float, float]:  # (Z_S, eps_bar)
    """Seed 002 §IV-B2: sampling the residual truncated to S, a_v / Z_S with a_v = [p(v) - q(v)]+,
    is within eps_bar = delta_p / (Z_S + delta_p) of the exact residual in TV, because the
    omitted residual mass Z_tail <= delta_p. Target coverage alone is no bound: p and q may agree
    on the head while [p - q]+ lies in the tail (then Z_S ~ 0 and eps_bar ~ 1).
    Growing S never raises delta_p nor lowers Z_S, so the bound only tightens."""
    z_support = float(torch.clamp(support_p.double() - support_q.double(), min=0.0).sum())
    tail = max(float(tail), 0.0)
    if tail == 0.0:
        return z_support, 0.0
    return z_support, tail / (z_support + tail)


def exact_recovery(
    proposals: Sequence[int],  # [N] tokens drawn i.i.d. from the target p
    p: torch.Tensor,  # [N] p(v) of each proposal
    q: torch.Tensor,  # [N] q(v) of each proposal
    uniforms: torch.Tensor,  # [N] U(0, 1)
) -> int | None:
    """Seed 002 §IV-B3: accept proposal v with b(v) = [1 - q(v)/p(v)]+, so P(v, accepted) =
    [p(v) - q(v)]+; the first accepted proposal is an exact draw from the residual. None when
    no proposal is accepted (the caller then falls back to the full distribution, still exact)."""
    for token, pv, qv, u in zip(proposals, p.tolist(), q.tolist(), uniforms.tolist(), strict=True):
        accept = max(1.0 - qv / pv, 0.0) if pv > 0 else 0.0
        if u < accept:
            return int(token)
    return None
