"""The PipeInfer-style runahead baseline: while a request's block waits, the edge drafts further
blocks of the same request from its unconfirmed prefix, presuming every open block fully accepted
and its bonus token equal to the drafter's own guess. A verdict that disagrees invalidates them.
Only this strategy ever has more than one open block per request."""

from __future__ import annotations

from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import EdgeRequest, OpenBlock


def may_run_ahead(request: EdgeRequest, policy: EdgePolicy, eos_ids: frozenset[int]) -> bool:
    """May a request whose block is open draft another block now?"""
    if not policy.runahead or len(request.ahead) >= policy.runahead_depth:
        return False
    presumed = request.presumed()
    ends = any(t in eos_ids for t in presumed[len(request.generated) :])
    return not ends and len(presumed) + 2 < request.limit


def presumption_held(request: EdgeRequest, settled: OpenBlock, token: int) -> bool:
    """Did the verdict confirm what the first runahead block presumed (all accepted, bonus guessed)?"""
    first = request.ahead[0] if request.ahead else None
    return first is not None and settled.accepted == len(settled.candidates) and token == first.message.root


def invalidate_ahead(request: EdgeRequest) -> None:
    """Discard every runahead block of the request, counting the wasted work; their positions'
    Nacks are then expected (`invalidated_bases`)."""
    stats = request.stats
    for dropped in request.ahead:
        stats.invalidated_blocks += 1
        stats.invalidated_tokens += 1 + len(dropped.candidates)
        stats.invalidated_uplink_bytes += dropped.size
        stats.invalidated_draft_s += dropped.draft_s
        request.invalidated_bases[dropped.id.base] += 1
    request.ahead.clear()
