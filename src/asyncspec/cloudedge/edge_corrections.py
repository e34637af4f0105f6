"""The edge's side of correcting a sampled rejection: a rejecting verdict opens a correction session
over the rejected position's draft distribution (which never left the edge), and each answer the
cloud sends moves it on. Whether to ask the cloud again or settle is `correction.py`'s policy."""

from __future__ import annotations

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.correction import Ask, CorrectionPolicy, CorrectionSession, Decided
from asyncspec.cloudedge.requests import EdgeRequest, OpenBlock


def settled_in_verdict(request: EdgeRequest, verdict: wire.Verdict) -> None:
    """Count a rejection the cloud settled inside its verdict: no correction round trip."""
    if verdict.settled_by:
        mode = "cloud" if verdict.settled_by == "recovery" else "residual"
        request.stats.corrections.observe(Decided(verdict.token, mode), rounds=0)


def open_session(
    request: EdgeRequest, block: OpenBlock, verdict: wire.Verdict, policy: CorrectionPolicy
) -> Decided | Ask:
    """The session of a rejecting verdict and its first step (the verdict carries the target's top-K
    head and, when asked for, round 0 of exact recovery with the uniforms the cloud decided with)."""
    block.session = CorrectionSession(block.q_rows[verdict.accepted], request.budget, policy, request.generator)
    proposals = None
    if verdict.proposal_ids:
        proposals = (
            wire.unpack_ids(verdict.proposal_ids),
            wire.unpack_probs(verdict.proposal_p),
            wire.unpack_probs(verdict.proposal_u),
        )
    support = wire.unpack_ids(verdict.support_ids)
    return block.session.first(support, wire.unpack_probs(verdict.support_p), verdict.tail, proposals)


def answers_query(block: OpenBlock | None, correction: wire.Correction) -> bool:
    """Is this the answer to the query the block has in flight (not a duplicate or a late one)?"""
    asked = block.asked if block is not None else None
    return asked is not None and (asked.kind, asked.start) == (correction.kind, correction.start)


def apply_answer(block: OpenBlock, correction: wire.Correction) -> Decided | Ask | str:
    """The session's next step after the cloud's answer; a string says why the answer is unusable."""
    block.asked = None
    session = block.session
    ids, p = wire.unpack_ids(correction.ids), wire.unpack_probs(correction.p)
    if correction.kind == "topk":
        return session.add_support(ids, p, correction.tail)
    if correction.kind == "proposals":
        return session.add_proposals(ids, p)
    if p.numel() != session.q.numel():
        return "the cloud sent a distribution of the wrong size"
    return session.add_full(p)
