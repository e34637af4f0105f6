"""Sampling fidelity through the real edge: blocks drafted by `drafting.draft_block` with the edge's
own PrefixDrafter, verified by the cloud's `verdicts.decide`, rejections corrected by
`edge_corrections.open_session` / `apply_answer` against `verdicts.correction`'s answers, exactly the
calls `edge.py` makes, without the sockets. Two candidates per block, so that within a block the
second candidate is tested after the first is accepted, and across blocks after a correction.

The measured law is that of the first two output tokens (x1, x2), against the target's own
p_T(x1) p_T(x2 | x1), at T = 0.7 and T = 1.3: a temperature handled wrongly anywhere moves it, where
at T = 1 the same bug is invisible (the first control shows both). Table models from
test_sampling_fidelity keep the decodes cheap.

The statistic is Pearson's chi-square of the 9 cells' counts against the law (8 degrees of freedom).
At 6,000 decodes it separates a TV of 0.05 from noise by orders of magnitude where the TV noise floor
of test_sampling_fidelity cannot (measured at 6,000: the right edge at P 0.57-0.90, the controls at
P 8e-16 and below): a right edge must not be rejected at P = 1e-6, a control must be at P < 1e-9."""

from __future__ import annotations

import math

import pytest
import torch

from asyncspec.cloudedge import edge_corrections, verdicts
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud import CloudRequest, CloudVerifier
from asyncspec.cloudedge.correction import CorrectionPolicy, CorrectionSession, Decided, FidelityBudget
from asyncspec.cloudedge.drafting import draft_block
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import EdgeRequest
from asyncspec.decoding.drafter import PrefixDrafter
from asyncspec.models.base import DecodeRequest
from asyncspec.verify import probabilities
from test_sampling_fidelity import VOCAB, TableDecoder, one_thread

assert one_thread  # the fixture: imported so that it applies here too

# neither law is certain anywhere and they disagree at every prefix, so every path occurs
TARGET = TableDecoder(
    "target",
    {(): [0.5, 0.3, 0.2], (0,): [0.1, 0.2, 0.7], (1,): [0.6, 0.3, 0.1], (2,): [0.3, 0.5, 0.2]},
)
# sharp where the target is not, so that q_T and q_1 differ by much (the temperature control)
DRAFTER = TableDecoder(
    "drafter",
    {(): [0.1, 0.1, 0.8], (0,): [0.05, 0.05, 0.9], (1,): [0.9, 0.05, 0.05], (2,): [0.05, 0.9, 0.05]},
)
DRAWS = 6_000
RIGHT_P = 1e-6  # a right edge fails with this probability
CONTROL_P = 1e-9
PROMPT = (1,)
# the edge's default: the verdict carries the top-16 head (here the whole support) and proposals
DEFAULT_CORRECTION = CorrectionPolicy()
# every rejection has to query the cloud: top-1 first, no proposals in the verdict
QUERYING_CORRECTION = CorrectionPolicy(k_schedule=(1, 2), verdict_proposals=0)


def two_token_law(temperature: float) -> torch.Tensor:
    def law(output: tuple[int, ...]) -> torch.Tensor:
        return probabilities(TARGET.logits_after(output), temperature).double()

    first = law(())
    return torch.stack([first[a] * law((a,)) for a in range(VOCAB)])


def chi_square_p_value(counts: torch.Tensor, law: torch.Tensor) -> float:
    """P(X >= Pearson's statistic) for X ~ chi-square with 2k = cells - 1 degrees of freedom, in its
    closed form for an even count: exp(-x/2) * sum_{i<k} (x/2)^i / i!."""
    expected = law.flatten() * counts.sum()
    half = 0.5 * float(((counts.flatten().double() - expected) ** 2 / expected).sum())
    k = (counts.numel() - 1) // 2
    return math.exp(-half) * sum(half**i / math.factorial(i) for i in range(k))


class RealEdgeRequest:
    """One edge request through the edge's own drafting and correction functions; the cloud side is
    its decision and correction logic on the target's table logits (seeded as the cloud seeds them)."""

    def __init__(self, draw: int, temperature: float, correction: CorrectionPolicy, drafter: PrefixDrafter):
        self.sampling = wire.Sampling(temperature=temperature, seed=draw)
        self.policy = EdgePolicy(block_size=2, correction=correction)
        generator = torch.Generator().manual_seed(7_000_003 * (draw + 1))
        self.request = EdgeRequest(1, PROMPT, self.sampling, 3, FidelityBudget(0.0), lambda event: None, generator)
        self.request.limit = 3
        self.request.drafter = drafter
        drafter.start(DecodeRequest(PROMPT, max_new_tokens=3))
        self.cloud_request = CloudRequest(
            1, self.sampling, correction.first_k, 0, None, first_proposals=correction.first_proposals
        )
        self.queried = False  # did a rejection need a correction round trip

    def first_two(self) -> tuple[int, int]:
        while len(self.request.generated) < 2:
            self.block()
        return self.request.generated[0], self.request.generated[1]

    def block(self) -> None:
        block = draft_block(self.request, self.policy, TARGET.max_length)
        assert block is not None and len(block.candidates) == 2 - len(self.request.generated)
        prefix = tuple(self.request.generated)
        rows = torch.stack(
            [TARGET.logits_after((*prefix, *block.candidates[:i])) for i in range(len(block.candidates) + 1)]
        )
        verdict = verdicts.decide(block.message, self.cloud_request, rows, TARGET.greedy, CLOUD.counters)
        block.accepted = verdict.accepted
        token = verdict.token if verdict.token >= 0 else self.corrected(block, verdict)
        self.request.generated += [*block.candidates[: verdict.accepted], token]

    def corrected(self, block, verdict: wire.Verdict) -> int:
        step = edge_corrections.open_session(self.request, block, verdict, self.policy.correction)
        while not isinstance(step, Decided):
            block.asked, self.queried = step, True
            query = wire.CorrectionQuery(block.id, step.kind, step.start, step.stop)
            answer = verdicts.correction(query, self.cloud_request.pending, self.sampling)
            assert edge_corrections.answers_query(block, answer)
            step = edge_corrections.apply_answer(block, answer)
            assert not isinstance(step, str), step
        return step.token


CLOUD = CloudVerifier(TARGET)  # only its counters and the target's argmax are used


def law_p_value(temperature: float, correction: CorrectionPolicy = DEFAULT_CORRECTION) -> tuple[float, int]:
    """(the chi-square P of the first two tokens' law, decodes whose correction queried the cloud)."""
    counts, queried = torch.zeros(VOCAB, VOCAB), 0
    drafter = PrefixDrafter(DRAFTER, DRAFTER)
    for draw in range(DRAWS):
        edge = RealEdgeRequest(draw, temperature, correction, drafter)
        first, second = edge.first_two()
        counts[first, second] += 1
        queried += edge.queried
    p_value = chi_square_p_value(counts, two_token_law(temperature))
    print(f"T={temperature}: chi-square P {p_value:.3g}, {queried} decodes queried the cloud")
    return p_value, queried


@pytest.mark.parametrize(
    ("temperature", "correction"), [(0.7, DEFAULT_CORRECTION), (1.3, QUERYING_CORRECTION)], ids=["T0.7", "T1.3"]
)
def test_the_real_edge_follows_the_tempered_target(temperature, correction):
    p_value, queried = law_p_value(temperature, correction)
    assert p_value > RIGHT_P
    if correction is QUERYING_CORRECTION:
        assert queried > DRAWS // 10
    else:
        assert queried == 0  # the verdict's top-16 head is the whole vocabulary: settled at the edge


def q_reported_at_temperature_one(monkeypatch) -> None:
    """The control: candidates drawn from q_T, but the edge keeps (and sends) q_1 ∝ q_T ** T, the
    drafter's law untempered: a temperature dropped between drafting and the uplink."""
    real_propose = PrefixDrafter.propose

    def propose(self, prefix, max_tokens, min_confidence=None, temperature=0.0, generator=None, keep_q=False, **rest):
        proposal = real_propose(self, prefix, max_tokens, min_confidence, temperature, generator, keep_q, **rest)
        if proposal.q is not None and temperature > 0:
            untempered = proposal.q.double().pow(temperature)
            proposal.q = (untempered / untempered.sum(-1, keepdim=True)).to(proposal.q.dtype)
        return proposal

    monkeypatch.setattr(PrefixDrafter, "propose", propose)


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_a_temperature_dropped_before_the_uplink_fails(temperature, monkeypatch):
    q_reported_at_temperature_one(monkeypatch)
    assert law_p_value(temperature)[0] < CONTROL_P


def test_the_same_temperature_bug_is_invisible_at_t1(monkeypatch):
    """Why the temperatures above: at T = 1 the control is the identity, and the law holds."""
    q_reported_at_temperature_one(monkeypatch)
    assert law_p_value(1.0)[0] > RIGHT_P


def test_an_edge_correcting_from_p_instead_of_the_residual_fails(monkeypatch):
    """The control of edge_corrections: the session opened over q = 0 samples p, not [p - q]+."""
    monkeypatch.setattr(
        edge_corrections, "CorrectionSession", lambda q, *rest: CorrectionSession(torch.zeros_like(q), *rest)
    )
    assert law_p_value(1.3, QUERYING_CORRECTION)[0] < CONTROL_P
