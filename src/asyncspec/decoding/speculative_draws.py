"""A window's fallback draws, each verifying candidates: exactly target-only's samples, in fewer calls.

Target-only decodes a draw one token per call (target_draws.py packs the five draws' rows into
one call per step). A fallback window's draws mostly retrace its earlier attempts, so here each
draw also feeds candidates looked up in them (draw_lookup.py), its rows packed with the other
draws' into calls whose width the plan picks (draw_plan.py); draws that have sampled the same
tokens so far feed one set of rows for all of them (draw_sharing.py). A candidate is accepted exactly when
it equals the token the draw samples at that position from the target's row, `decide` keyed by
(seed, position) as target-only keys it (sampling.py); at the first that differs the draw takes
its own sample and rolls back. Rows never depend on the call they are in (the fixed-shape engine,
proven by the invariance self-test; calls wider than one block only at the stack sizes its batch
check proved), so every draw's tokens and log-probabilities are bitwise its `decode_target_only`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from asyncspec.decoding.draw_lookup import DrawLookup, ReferenceIndex
from asyncspec.decoding.draw_plan import kept_call_costs, plan_rows
from asyncspec.decoding.draw_sharing import share_states
from asyncspec.decoding.result import DecodeConfig, DecodeResult, DecodeStats, commit_token, output_limit
from asyncspec.decoding.target_draws import prefilled_draws, share_out
from asyncspec.models.base import DecodeRequest, DecoderState
from asyncspec.sampling import decide, token_logprob
from asyncspec.trace import Trace

METHOD = "target"  # the draws are target-only's samples, whichever method asked for them
MOST_CANDIDATES = 7  # a draw's rows in one call: its root and up to 7 candidates, one block


@dataclass
class _Draw:
    config: DecodeConfig
    state: DecoderState
    length: int  # the positions of `state` that hold its rows (draw_sharing.py)
    lookup: DrawLookup
    row: torch.Tensor  # the logits that decide its next token
    tokens: list[int] = field(default_factory=list)
    stats: DecodeStats = field(default_factory=DecodeStats)
    going: bool = True
    accepted: int = 0  # candidates accepted so far, and rejected: its acceptance estimate
    rejected: int = 0

    @property
    def acceptance(self) -> float:
        return (self.accepted + 1) / (self.accepted + self.rejected + 2)

    def take(self, target, row: torch.Tensor, token: int | None, limit: int) -> None:
        """Commit the draw's positional sample from `row` (or `token`, when it was already drawn)."""
        if token is None:
            token = decide(target, row[None], self.config.temperature, self.config.seed, len(self.tokens))[0]
        self.stats.logprobs.append(token_logprob(row, token))
        self.going = commit_token(token, self.tokens, target.eos_ids, limit, self.stats)


def decode_speculative_draws(
    target,
    request: DecodeRequest,
    configs: Sequence[DecodeConfig],
    references: Sequence[Sequence[int]],
    most_blocks: int = 1,
) -> list[DecodeResult]:
    """One DecodeResult per config (positional sampling only), each equal to
    `decode_target_only(target, None, request, config)`. references: the window's earlier attempts'
    tokens (the greedy one first); most_blocks: the widest call, in blocks, the batch check proved."""
    trace = Trace()
    prefilled = prefilled_draws(target, request, configs, trace)
    index = ReferenceIndex(references)
    draws = [_Draw(c, prefilled, prefilled.length, DrawLookup(index), prefilled.next_logits) for c in configs]
    limit, prefill_s = output_limit(request, target), trace.now()
    width = target.call_width
    # timed on an empty cache beside the draws' (a copy would clone the prompt's keys and values)
    costs = kept_call_costs(target, lambda: (prefilled.cache.sibling(), prefilled.length), most_blocks)
    pending: list[int | None] = [None] * len(draws)
    while True:
        for draw, token in zip(draws, pending, strict=True):
            if draw.going:
                draw.take(target, draw.row, token, limit)
        # draws with the same tokens propose the same candidates (a lookup is a function of the
        # tokens) and would compute the same rows: the first of each group verifies for all
        groups = share_states(target, draws)
        if not groups:
            break
        leaders = [group[0] for group in groups]
        proposals = [_proposal(target, draw, limit) for draw in leaders]
        plan = plan_rows([len(p) for p in proposals], [d.acceptance for d in leaders], width, costs, most_blocks)
        lists = [[draw.tokens[-1], *p[:n]] for draw, p, n in zip(leaders, proposals, plan.candidates, strict=True)]
        with trace.stage("verify", width=sum(map(len, lists)), blocks=plan.blocks):
            rows = target.extend_packed([draw.state for draw in leaders], lists, most_blocks)
        found = {
            id(draw): _verify(target, draw, tokens[1:], logits, limit)
            for group, tokens, logits in zip(groups, lists, rows, strict=True)
            for draw in group
        }
        pending = [found.get(id(draw)) for draw in draws]
    share_out([draw.stats for draw in draws], prefilled, prefill_s, trace.now() - prefill_s)
    return [DecodeResult(METHOD, draw.tokens, draw.stats, trace) for draw in draws]


def _proposal(target, draw: _Draw, limit: int) -> list[int]:
    """Candidates that fit: no more than the draw may still commit, nor than its cache holds."""
    room = min(MOST_CANDIDATES, limit - len(draw.tokens), target.max_length - draw.state.length - 1)
    return draw.lookup.propose(draw.tokens, room)


def _verify(target, draw: _Draw, candidates: list[int], logits: torch.Tensor, limit: int) -> int | None:
    """Accept the candidates while each equals the draw's own sample from the row before it; keep
    the row after the last accepted one, and the length up to it (the rest is rolled back when the
    draws are next grouped: the state may be shared). The sample that rejected a candidate (None
    when none did) is the draw's next token."""
    draw.stats.target_calls += 1
    draw.stats.call_widths.append(len(candidates) + 1)
    position, rejected_by = 0, None
    for position, candidate in enumerate(candidates):
        sample = decide(target, logits[position][None], draw.config.temperature, draw.config.seed, len(draw.tokens))[0]
        if sample != candidate:
            rejected_by = sample
            break
        draw.take(target, logits[position], candidate, limit)
        if not draw.going:
            position += 1
            break
    else:
        position = len(candidates)
    draw.stats.observe_round(len(candidates), position)
    draw.accepted += position
    draw.rejected += rejected_by is not None
    draw.length = draw.state.length - len(candidates) + position
    draw.row = logits[position]
    return rejected_by
