"""The cloud's answers about one block: the verdict (greedy, the full-uplink baselines' own
correction, or AsymSpec's compact-uplink accept test with the rejection settled in the verdict
where the cloud can decide it) and the answers to the edge's correction queries. Pure functions of
the block, the request's state and the target's logits; every random draw is seeded by position."""

from __future__ import annotations

import torch

from asyncspec.cloudedge import logprobs, validation
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.cloud_state import CloudCounters, CloudRequest, PendingCorrection, seeded
from asyncspec.shaping import growing_histories, penalised, shaped_probabilities
from asyncspec.verify import first_rejection, greedy_verify, speculative_accept

MAX_PROPOSALS = validation.MAX_PROPOSALS
# Slack on the bound q(v) <= 1 - q(rejected) for v != rejected: the edge's float32 softmax sums to 1
# only to within rounding, so its other entries may exceed 1 - q(rejected) by that much.
Q_BOUND_SLACK = 1e-4


def tail_mass(p: torch.Tensor, outside: torch.Tensor) -> float:
    """The target mass outside a support, at most 1: a float32 softmax sums to 1 only within rounding, so
    with no support at all (first_k 0, the "no top-K" ablation) the sum could exceed 1 by more than the
    receiver's slack and the verdict was refused as invalid (a request of the 2026-11-30 #16 grid failed so)."""
    return min(float(p[outside].double().sum()), 1.0)


def decide(
    block: wire.Block, request: CloudRequest, logits: torch.Tensor, greedy, counters: CloudCounters
) -> wire.Verdict:
    """logits [n + 1, V]: row i predicts the token after root, c1, ..., ci. `greedy`: the target's argmax."""
    candidates = wire.unpack_ids(block.candidates)
    request.pending = None
    histories = row_histories(block, request, candidates)
    if request.sampling.greedy:
        law = penalised(logits, histories, request.sampling.shaping)
        outcome = greedy_verify(greedy(law), candidates)
        verdict = _settled(block, request, outcome.accepted, outcome.next_token, counters)
    else:
        law = shaped_probabilities(logits, request.sampling.temperature, request.sampling.shaping, histories)
        verdict = _sampled(block, request, law, candidates, counters)
    if request.logprobs == logprobs.NOT_ASKED:
        return verdict
    return logprobs.attach(verdict, logprobs.law_log(law, request.sampling.greedy), candidates, request.logprobs)


def _sampled(
    block: wire.Block, request: CloudRequest, p: torch.Tensor, candidates: list[int], counters: CloudCounters
) -> wire.Verdict:
    """The verdict of a sampled block under the target's shaped law p [n + 1, V]."""
    generator = seeded(request.sampling.seed, block.id.base, "accept")
    if block.q_full:  # baseline: the full draft distribution came up, the cloud corrects itself
        q = wire.unpack_probs(block.q_full).reshape(len(candidates), -1)
        outcome = speculative_accept(p, q, candidates, generator)
        rejected = outcome.accepted < len(candidates)
        counters.rejections += rejected
        return _settled(block, request, outcome.accepted, outcome.next_token, counters, "residual" if rejected else "")
    q_of_candidates = wire.unpack_probs(block.q).tolist()
    index = first_rejection(p, q_of_candidates, candidates, generator)
    if index is not None:
        return _rejected(block, request, index, p[index], candidates[index], q_of_candidates[index], counters)
    bonus = int(torch.multinomial(p[len(candidates)], 1, generator=generator))
    return _settled(block, request, len(candidates), bonus, counters)


def row_histories(block: wire.Block, request: CloudRequest, candidates: list[int]) -> list[list[int]]:
    """The generated tokens before each row of the block's logits (the penalties' counts): the
    confirmed output, the root when it is output (not the prompt's last token), then c1..ci."""
    if not request.sampling.shaping.penalises:
        return [[] for _ in range(len(candidates) + 1)]
    confirmed = request.state.tokens[request.prompt_len : block.id.base - 1]
    root = [block.root] if block.id.base - 1 >= request.prompt_len else []
    return growing_histories([*confirmed, *root], candidates)


def _settled(
    block: wire.Block, request: CloudRequest, accepted: int, token: int, counters: CloudCounters, settled_by: str = ""
) -> wire.Verdict:
    counters.accepted += accepted
    request.expected_root = token
    return wire.Verdict(block.id, accepted, token, settled_by=settled_by)


def _rejected(
    block: wire.Block,
    request: CloudRequest,
    index: int,
    p: torch.Tensor,
    rejected: int,
    q_rejected: float,
    counters: CloudCounters,
) -> wire.Verdict:
    """A sampled rejection at candidate `index`. With proposals requested, round 0 of exact recovery
    is drawn here: when the cloud can decide it from q(rejected) alone, it settles the rejection in
    this verdict; otherwise the verdict carries the round (proposals, p, uniforms) for the edge."""
    counters.rejections += 1
    proposals = None
    if request.first_proposals:
        proposals = round_zero(request.sampling, block.id.base, request.first_proposals, p)
        token = recover_from_bound(*proposals, rejected, q_rejected)
        if token is not None:
            counters.settled_in_verdict += 1
            return _settled(block, request, index, token, counters, "recovery")
    counters.accepted += index
    order = torch.argsort(p, descending=True, stable=True)
    request.pending = PendingCorrection(block.id, p, order)
    request.expected_root = None
    head = order[: request.first_k]
    tail = tail_mass(p, order[request.first_k :])
    attached: dict[str, bytes] = {}
    if proposals is not None:
        ids, p_ids, uniforms = proposals
        attached = dict(
            proposal_ids=wire.pack_ids(ids), proposal_p=wire.pack_probs(p_ids), proposal_u=wire.pack_probs(uniforms)
        )
    return wire.Verdict(
        block.id,
        index,
        -1,
        wire.pack_ids(head),
        wire.pack_probs(p[head]),
        wire.f32(tail),
        **attached,  # type: ignore[arg-type]
    )


def round_zero(sampling, base: int, count: int, p: torch.Tensor) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """Round 0 of exact recovery at position `base`: proposals v ~ p, their p(v), and float32 uniforms
    (the values both sides decide with). The proposals are those a query of round 0 would return."""
    count = min(max(count, 1), MAX_PROPOSALS)
    ids = torch.multinomial(p, count, replacement=True, generator=seeded(sampling.seed, base, "proposals", 0))
    uniforms = torch.rand(count, generator=seeded(sampling.seed, base, "uniforms", 0), dtype=torch.float64)
    return ids.tolist(), p[ids].float(), uniforms.float()


def recover_from_bound(
    proposals: list[int], p: torch.Tensor, uniforms: torch.Tensor, rejected: int, q_rejected: float
) -> int | None:
    """Exact recovery (`verify.exact_recovery`: accept v with u < [1 - q(v)/p(v)]+, the first accepted
    proposal is the draw) decided with what the cloud knows of q: q(rejected) exactly, and for every
    other v only the bound q(v) <= 1 - q(rejected). The rejected candidate's own threshold is known
    (it is never accepted: it was rejected because p < q there); another proposal is known accepted
    when u clears the threshold of the bound, and unknown otherwise — then the cloud cannot decide
    (None) and the edge, which holds q, finishes the same round with the same uniforms. Whenever this
    returns a token, the edge's exact run would have returned the same one."""
    bound = min(1.0 - q_rejected + Q_BOUND_SLACK, 1.0)
    for token, pv, u in zip(proposals, p.tolist(), uniforms.tolist(), strict=True):
        if token == rejected:
            threshold = max(1.0 - q_rejected / pv, 0.0) if pv > 0 else 0.0
            if u < threshold:
                return int(token)
            continue  # decided: rejected
        if pv > 0 and u < 1.0 - bound / pv:
            return int(token)  # accepted under the bound, so under every q the edge may hold
        return None  # accepted or not depends on q(v), which only the edge knows
    return None  # every proposal was the rejected candidate: the edge decides (nothing was accepted)


def correction(query: wire.CorrectionQuery, pending: PendingCorrection, sampling) -> wire.Correction:
    """The answer to a correction query about a pending rejection: a range of the target's top-K, a
    round of exact-recovery proposals, or the full target distribution."""
    p = pending.p
    if query.kind == "topk":
        stop = min(max(query.stop, query.start), p.numel())
        ids = pending.order[query.start : stop]
        tail = tail_mass(p, pending.order[stop:])
        return wire.Correction(
            query.id, "topk", query.start, wire.pack_ids(ids), wire.pack_probs(p[ids]), wire.f32(tail)
        )
    if query.kind == "proposals":
        count = min(max(query.stop, 1), MAX_PROPOSALS)
        generator = seeded(sampling.seed, query.id.base, "proposals", query.start)
        ids = torch.multinomial(p, count, replacement=True, generator=generator)
        return wire.Correction(query.id, "proposals", query.start, wire.pack_ids(ids), wire.pack_probs(p[ids]))
    return wire.Correction(query.id, "full", 0, b"", wire.pack_probs(p))
