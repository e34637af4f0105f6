"""Building one block from a request's prefix: the edge's drafting, free of sockets and scheduling.

A block is drafted from the confirmed prefix (its root is the last confirmed token), or under
runahead from the presumed prefix (its first drafted token guesses the previous block's bonus and
becomes its root). What goes up is the uplink strategy's: the candidates' ids with q(id) (compact),
or also every position's full draft distribution (the standard exchange of the baselines).
"""

from __future__ import annotations

import time

import torch

from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.policy import EdgePolicy
from asyncspec.cloudedge.requests import EdgeRequest, OpenBlock


def block_length(request: EdgeRequest, policy: EdgePolicy) -> int:
    """Candidates for the request's next block: the policy's block size, or with adaptive_gamma the
    length its running acceptance supports (EdgePolicy.gamma_for)."""
    if not policy.adaptive_gamma:
        return policy.block_size
    gamma = policy.gamma_for(request.acceptance.estimate)
    request.stats.gammas[gamma] += 1
    return gamma


def draft_block(
    request: EdgeRequest, policy: EdgePolicy, cloud_max_length: int, ahead: bool = False
) -> OpenBlock | None:
    """The request's next block (None when runahead has nothing left to draft)."""
    generated = request.presumed() if ahead else request.generated
    base = len(request.prompt) + len(generated) + (1 if ahead else 0)
    used = len(generated) + (1 if ahead else 0)
    room = min(block_length(request, policy), request.limit - used - 1, cloud_max_length - base)
    candidates, q_rows, root = [], None, (None if ahead else request.confirmed[-1])
    if room > 0 or ahead:
        proposal = request.drafter.propose(
            generated,
            max(room, 0) + (1 if ahead else 0),
            min_confidence=policy.draft_min_confidence,
            temperature=request.sampling.temperature,
            shaping=request.sampling.shaping,
            generator=request.generator,
            keep_q=policy.uplink == "full",
        )
        if ahead and not proposal.tokens:
            return None  # the drafter has no room left: nothing to run ahead with
        skip = 1 if ahead else 0
        root = proposal.tokens[0] if ahead else root
        candidates = proposal.tokens[skip : skip + max(room, 0)]
        q_rows = proposal.q[skip : skip + len(candidates)] if proposal.q is not None else None
    q_bytes, q_full = uplink_payload(policy, candidates, q_rows, request.sampling.temperature)
    block_id = wire.BlockId(request.id, base, len(candidates), request.sampling.digest())
    message = wire.Block(block_id, root, wire.pack_ids(candidates), q_bytes, q_full)
    return OpenBlock(message, candidates, q_rows, time.monotonic())


def uplink_payload(
    policy: EdgePolicy, candidates: list[int], q_rows: torch.Tensor | None, temperature: float
) -> tuple[bytes, bytes]:
    """(q of each candidate, full distributions): AsymSpec sends only the first, and only when
    sampling; the symmetric exchange of the baselines sends the distributions even when greedy."""
    if q_rows is None:
        return b"", b""
    q_bytes = wire.pack_probs(q_rows[torch.arange(len(candidates)), candidates]) if temperature > 0 else b""
    q_full = wire.pack_probs(q_rows.reshape(-1)) if policy.uplink == "full" else b""
    return q_bytes, q_full
