"""The draft -> verify -> commit loop shared by the serial speculative methods.

A candidate source (strategy interface, as in HF's candidate generators) proposes tokens after
the committed prefix; the target verifies root + candidates in one call of width K = n + 1,
keeps the KV of the accepted ones only, and its own next token becomes the next call's root.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

import torch

from asyncspec.decoding.drafter import DrafterCounters, Proposal
from asyncspec.decoding.result import (
    DecodeConfig,
    DecodeResult,
    DecodeStats,
    commit_token,
    observe_prefill,
    output_limit,
)
from asyncspec.models.base import Decoder, DecodeRequest, DecoderState
from asyncspec.models.selftest import require_invariant
from asyncspec.sampling import make_generator, next_token
from asyncspec.trace import Trace
from asyncspec.verify import Verdict, greedy_verify, probabilities, speculative_accept


class CandidateSource(Protocol):
    counters: DrafterCounters

    def start(self, request: DecodeRequest) -> None: ...

    def get_candidates(self, committed: list[int], max_tokens: int) -> Proposal: ...

    def update(self, proposal: Proposal, verdict: Verdict) -> None: ...


def speculative_decode(
    method: str, target: Decoder, source: CandidateSource, request: DecodeRequest, config: DecodeConfig, budget: int
) -> DecodeResult:
    require_invariant(target, method)
    trace, stats, committed = Trace(), DecodeStats(), list[int]()
    generator = make_generator(config.seed)
    with trace.stage("prefill"):
        state = target.prefill(request)
        source.start(request)
    stats.prefill_s = trace.now()
    observe_prefill(stats, state)
    root = next_token(target, state.next_logits, config.temperature, generator)
    limit = output_limit(request, target)
    while commit_token(root, committed, target.eos_ids, limit, stats):
        room = min(budget, limit - len(committed), target.max_length - state.length - 1)
        with trace.stage("draft") as meta:
            calls_before = source.counters.calls
            proposal = source.get_candidates(committed, room)
            meta["drafter_calls"] = source.counters.calls - calls_before
        candidates = proposal.tokens[:room]
        verdict = verify_candidates(
            target,
            state,
            root,
            candidates,
            trace,
            stats,
            partial(_verify, target, proposal=proposal, candidates=candidates, config=config, generator=generator),
        )
        stats.observe_round(len(candidates), verdict.accepted)
        source.update(proposal, verdict)
        if not all(commit_token(t, committed, target.eos_ids, limit, stats) for t in candidates[: verdict.accepted]):
            break
        root = verdict.next_token
    stats.decode_s = trace.now() - stats.prefill_s
    stats.draft_s = trace.total("draft")
    stats.drafter_calls = source.counters.calls
    stats.convert_s = source.counters.convert_s
    stats.recycled = source.counters.recycled
    return DecodeResult(method, committed, stats, trace)


def verify_candidates(
    target: Decoder,
    state: DecoderState,
    root: int,
    candidates: list[int],
    trace: Trace,
    stats: DecodeStats,
    decide: Callable[[torch.Tensor], Verdict],
) -> Verdict:
    """One target call of width K = 1 + len(candidates) on the committed prefix; the KV of the
    rejected candidates is removed before returning, so only accepted tokens (and the root) stay."""
    with trace.stage("verify", width=len(candidates) + 1):
        logits = target.extend(state, [root, *candidates])
    stats.target_calls += 1
    stats.call_widths.append(len(candidates) + 1)
    verdict = decide(logits)
    if verdict.accepted < len(candidates):
        target.rollback(state, state.length - (len(candidates) - verdict.accepted))
    return verdict


def _verify(target, logits, *, proposal, candidates, config, generator) -> Verdict:
    if config.temperature <= 0:
        return greedy_verify(target.greedy(logits), candidates)
    p = probabilities(logits, config.temperature)
    return speculative_accept(p, proposal.q[: len(candidates)], candidates, generator)
