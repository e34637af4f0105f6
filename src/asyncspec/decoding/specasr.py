"""SpecASR's adaptive single-sequence prediction (ASP) with draft recycling (Wei et al., 2025),
as ported in seed 000 App. D.1.3.

ASP: the drafter keeps proposing while the softmax probability of its token is >= 0.4; the
low-confidence token is included before stopping; at most 24 proposals (verifier width <= 25).
Recycling: after a rejection the drafter predicts one token after the corrected prefix; if it
matches the old draft's remainder at the same or an adjacent position, that remainder is
proposed again instead of being drafted anew. Reused tokens are verified like any other, so
a wrong realignment costs verification width, never correctness.
"""

from __future__ import annotations

from dataclasses import dataclass

from asyncspec.decoding.drafter import PrefixDrafter, Proposal
from asyncspec.decoding.result import DecodeConfig, DecodeResult
from asyncspec.decoding.speculative import speculative_decode
from asyncspec.decoding.standard_sd import require_drafter
from asyncspec.errors import InputError
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.verify import Verdict

METHOD = "specasr"
CONFIDENCE_THRESHOLD = 0.4
MAX_PROPOSALS = 24


@dataclass(frozen=True)
class Rejection:
    """What the last round left unverified: the rejected candidate and the candidates after it."""

    rejected: int
    remainder: list[int]
    correction: int


def realign(first: int, rejection: Rejection) -> list[int]:
    """The old tokens to propose after `first` (the drafter's token after the corrected prefix).

    same position: the target substituted its correction for the rejected token -> remainder;
    the target inserted a token: the drafter now predicts the rejected token -> remainder again;
    the drafter had an extra token: the correction is remainder[0] -> remainder[2:] after remainder[1].
    """
    remainder = rejection.remainder
    if remainder and first == remainder[0]:
        return remainder[1:]
    if first == rejection.rejected:
        return remainder
    if len(remainder) > 1 and rejection.correction == remainder[0] and first == remainder[1]:
        return remainder[2:]
    return []


class AdaptiveRecyclingSource:
    def __init__(self, drafter: PrefixDrafter, cap: int, threshold: float = CONFIDENCE_THRESHOLD, recycle: bool = True):
        self.drafter = drafter
        self.counters = drafter.counters
        self.cap = cap
        self.threshold = threshold
        self.recycle = recycle
        self.pending: Rejection | None = None

    def start(self, request: DecodeRequest) -> None:
        self.drafter.start(request)
        self.pending = None

    def get_candidates(self, committed: list[int], max_tokens: int) -> Proposal:
        cap = min(self.cap, max_tokens)
        if cap <= 0:
            return Proposal([], [])
        if self.pending is None or not self.recycle:
            return self.drafter.propose(committed, cap, min_confidence=self.threshold)
        first = self.drafter.propose(committed, 1)
        if not first.tokens:
            return first
        reused = realign(first.tokens[0], self.pending)[: cap - 1]
        self.counters.recycled += len(reused)
        if reused or first.tokens[0] in self.drafter.target.eos_ids or first.confidences[0] < self.threshold:
            return Proposal(first.tokens + reused, first.confidences, None, first.drafted)
        more = self.drafter.propose(committed + first.tokens, cap - 1, min_confidence=self.threshold)
        return Proposal(first.tokens + more.tokens, first.confidences + more.confidences, None, 1 + more.drafted)

    def update(self, proposal: Proposal, verdict: Verdict) -> None:
        tokens = proposal.tokens
        if verdict.accepted < len(tokens):
            self.pending = Rejection(tokens[verdict.accepted], tokens[verdict.accepted + 1 :], verdict.next_token)
        else:
            self.pending = None


def decode_specasr(
    target: Decoder, drafter: Decoder | None, request: DecodeRequest, config: DecodeConfig
) -> DecodeResult:
    if config.temperature > 0:
        raise InputError("specasr is a greedy method (temperature 0)")
    cap = config.budget_for(METHOD, MAX_PROPOSALS)
    source = AdaptiveRecyclingSource(PrefixDrafter(require_drafter(drafter, METHOD), target), cap)
    return speculative_decode(METHOD, target, source, request, config, cap)
