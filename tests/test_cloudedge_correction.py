"""Certified progressive correction: certificate math, and the law of the emitted correction token
(many draws, small vocabulary) with the cloud simulated from the exact p."""

from __future__ import annotations

import pytest
import torch

from asyncspec.cloudedge.correction import Ask, CorrectionPolicy, CorrectionSession, Decided, FidelityBudget
from asyncspec.verify import exact_recovery, residual, tv_certificate

DRAWS = 6_000


def noise_floor(law: torch.Tensor, draws: int = DRAWS) -> float:
    """Four times the expected TV between a law and its empirical distribution from `draws`
    samples: E|count_i/N - p_i| ~ sqrt(2 p_i (1 - p_i) / (pi N)), halved and summed. For a
    two-token law that is ~3.2 standard deviations; laws with more tokens concentrate more."""
    law = law.double()
    return 4 * 0.5 * float(torch.sqrt(2 * law * (1 - law) / (torch.pi * draws)).sum())


POLICY = CorrectionPolicy(k_schedule=(4, 8, 16), proposals=8)


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * (a.double() - b.double()).abs().sum().item()


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return (x / x.sum()).float()


def head_agrees_tail_residual() -> tuple[torch.Tensor, torch.Tensor]:
    """p and q nearly agree on p's top 8 (90 % of p's mass); the residual [p - q]+ lies in p's tail."""
    head = torch.tensor([0.2, 0.15, 0.13, 0.12, 0.1, 0.08, 0.07, 0.05])
    p = _normalise(torch.cat([head, torch.full((24,), 0.1 / 24)]))
    q_tail = torch.cat([torch.full((2,), 0.062), torch.full((22,), 1e-4)])  # q's extra tail mass on 2 tokens
    q = _normalise(torch.cat([head - (q_tail.sum() - 0.1) / 8, q_tail]))
    return p, q


def bounded_case() -> tuple[torch.Tensor, torch.Tensor]:
    """Most residual on p's head, a thin tail: a top-4 draw is certified at eps ~ 0.07."""
    p = _normalise(torch.cat([torch.tensor([0.4, 0.3, 0.15, 0.13]), torch.full((28,), 0.02 / 28)]))
    q = _normalise(torch.cat([torch.tensor([0.1, 0.1, 0.3, 0.3]), torch.full((28,), 0.2 / 28)]))
    return p, q


def run_session(p, q, eps_req, generator, policy=POLICY, naive_coverage=None, order=None) -> Decided:
    """Drive one session against a cloud that knows p exactly (order: descending p, stable)."""
    order = order or torch.argsort(p, descending=True, stable=True).tolist()
    session = CorrectionSession(q, FidelityBudget(eps_req), policy, generator)
    k = policy.k_schedule[0]
    step = session.first(order[:k], p[order[:k]], float(p[order[k:]].double().sum()))
    if naive_coverage is not None:  # the wrong rule: trust top-K coverage, sample [p - q]+ on the head
        excess = torch.clamp(p[order[:k]] - q[order[:k]], min=0)
        return Decided(order[int(torch.multinomial(excess, 1, generator=generator))], "naive")
    while isinstance(step, Ask):
        if step.kind == "topk":
            ids = order[step.start : step.stop]
            step = session.add_support(ids, p[ids], float(p[order[step.stop :]].double().sum()))
        elif step.kind == "proposals":
            ids = torch.multinomial(p, step.stop, replacement=True, generator=generator).tolist()
            step = session.add_proposals(ids, p[ids])
        else:
            step = session.add_full(p)
    return step


def emitted(p, q, eps_req, **kwargs) -> tuple[torch.Tensor, list[Decided]]:
    generator = torch.Generator().manual_seed(99)
    counts = torch.zeros(p.numel())
    order = torch.argsort(p, descending=True, stable=True).tolist()
    decisions = [run_session(p, q, eps_req, generator, order=order, **kwargs) for _ in range(DRAWS)]
    for decided in decisions:
        counts[decided.token] += 1
    return counts / DRAWS, decisions


def test_certificate_formula_and_monotone_in_k():
    p, q = head_agrees_tail_residual()
    order = torch.argsort(p, descending=True).tolist()
    previous = 1.0
    for k in range(1, p.numel() + 1):
        z_s, eps = tv_certificate(p[order[:k]], q[order[:k]], float(p[order[k:]].sum()))
        tail = float(p[order[k:]].sum())
        assert eps == pytest.approx(tail / (z_s + tail) if tail else 0.0)
        assert eps <= previous + 1e-9
        previous = eps
        # the bound holds for the true TV between truncated and exact residual
        a = torch.clamp(p - q, min=0).double()
        on_support = torch.zeros_like(a)
        on_support[order[:k]] = a[order[:k]]
        if on_support.sum() > 0:
            assert _tv(on_support / on_support.sum(), a / a.sum()) <= eps + 1e-6
    assert previous == 0.0


def test_head_agreement_gets_a_loose_certificate_although_coverage_is_high():
    p, q = head_agrees_tail_residual()
    order = torch.argsort(p, descending=True).tolist()
    coverage = float(p[order[:8]].sum())
    _, eps = tv_certificate(p[order[:8]], q[order[:8]], 1 - coverage)
    assert coverage >= 0.89 and eps > 0.5


def test_exact_recovery_is_the_residual_law():
    p, q = bounded_case()
    generator = torch.Generator().manual_seed(5)
    counts = torch.zeros(p.numel())
    for _ in range(DRAWS):
        token = None
        while token is None:
            ids = torch.multinomial(p, 4, replacement=True, generator=generator).tolist()
            token = exact_recovery(ids, p[ids], q[ids], torch.rand(4, generator=generator))
        counts[token] += 1
    assert _tv(counts / DRAWS, residual(p, q)) < noise_floor(residual(p, q))


@pytest.mark.parametrize("case", [head_agrees_tail_residual, bounded_case])
def test_zero_budget_corrections_are_exact(case):
    p, q = case()
    law, decisions = emitted(p, q, 0.0)
    assert _tv(law, residual(p, q)) < noise_floor(residual(p, q))
    assert all(d.eps == 0.0 for d in decisions)
    assert {d.mode for d in decisions} <= {"exact", "full"}


def test_bounded_corrections_stay_within_the_charged_certificate():
    p, q = bounded_case()
    law, decisions = emitted(p, q, 0.1)
    bounded = [d for d in decisions if d.mode == "topk"]
    assert len(bounded) == DRAWS  # certified at K = 4 every time
    eps = bounded[0].eps
    assert 0 < eps <= 0.1
    measured = _tv(law, residual(p, q))
    assert measured <= eps + noise_floor(law)
    # and it is the truncated law the certificate speaks of (not something else within budget)
    order = torch.argsort(p, descending=True).tolist()[:4]
    truncated = torch.zeros_like(p)
    truncated[order] = torch.clamp(p[order] - q[order], min=0)
    assert _tv(law, truncated / truncated.sum()) < noise_floor(truncated / truncated.sum())


def test_head_agrees_tail_residual_with_a_budget_expands_or_goes_exact():
    p, q = head_agrees_tail_residual()
    law, decisions = emitted(p, q, 0.05)
    assert _tv(law, residual(p, q)) <= 0.05 + noise_floor(residual(p, q))
    assert all(d.eps <= 0.05 for d in decisions)
    assert any(d.mode != "topk" or d.k > 4 for d in decisions)  # K = 4 alone was never certified


def test_coverage_alone_would_be_wrong_here():
    """The rule the certificate replaces (trust a high top-K coverage) fails the same measurement."""
    p, q = head_agrees_tail_residual()
    law, _ = emitted(p, q, 0.05, naive_coverage=0.8)
    assert _tv(law, residual(p, q)) > 0.5


def test_budget_is_never_exceeded_over_many_corrections():
    p, q = bounded_case()
    budget = FidelityBudget(0.3)
    generator = torch.Generator().manual_seed(1)
    order = torch.argsort(p, descending=True).tolist()
    modes = []
    for _ in range(20):
        session = CorrectionSession(q, budget, POLICY, generator)
        step = session.first(order[:4], p[order[:4]], float(p[order[4:]].sum()))
        while isinstance(step, Ask):
            step = session.add_full(p) if step.kind == "full" else step
            if isinstance(step, Ask) and step.kind == "topk":
                step = session.add_support(order[step.start : step.stop], p[order[step.start : step.stop]], 0.0)
            elif isinstance(step, Ask):
                step = session.add_full(p)
        modes.append(step.mode)
    assert budget.spent <= 0.3
    assert modes.count("topk") >= 4  # four bounded draws fit, then exact ones
