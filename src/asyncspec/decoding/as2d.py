"""As²d: target-decoupled speculative decoding (seed 000 §4, App. C).

A producer drafts from the audio and its own history only, concurrently, and publishes batches
into the candidate buffer. At each boundary the target takes up to `budget` ready candidates at
the cursor, verifies them with its known root in one call, commits the matching prefix and its
own next token, and realigns the cursor. With nothing ready it takes a one-token step: the
target never waits for the producer.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from asyncspec.decoding.result import DecodeConfig, DecodeResult, DecodeStats, commit_token, output_limit
from asyncspec.decoding.speculative import verify_candidates
from asyncspec.errors import InputError
from asyncspec.models.base import Decoder, DecodeRequest
from asyncspec.models.selftest import require_invariant
from asyncspec.ondevice.accounting import account
from asyncspec.ondevice.align import realign
from asyncspec.ondevice.buffer import CandidateBuffer
from asyncspec.trace import StageEvent, Trace
from asyncspec.verify import greedy_verify

METHOD = "as2d"
DEFAULT_BUDGET = 6  # measured here: K <= 7 beat K <= 13 (a width-8 call costs ~1.8x width 1 on this CPU)
CONFIDENCE_THRESHOLD = 0.4


class Producer(Protocol):
    def start(self, audio: np.ndarray) -> CandidateBuffer: ...

    def finish(self, buffer: CandidateBuffer) -> None: ...


def decode_as2d(
    target: Decoder, drafter: Producer | None, request: DecodeRequest, config: DecodeConfig
) -> DecodeResult:
    if drafter is None or not hasattr(drafter, "start"):
        raise InputError("as2d needs a producer (a target-decoupled drafter process)")
    if config.temperature > 0:
        raise InputError("as2d is a greedy method (temperature 0)")
    require_invariant(target, METHOD)
    trace, stats, committed = Trace(), DecodeStats(), []
    # The request arrives: drafting starts now, never before, and runs on its own core while the
    # target encodes the audio and prefills its prompt (it reads only the audio, never target state).
    # Measured (bench e2e, quiet 2-core machine, 15 files): the encoder on both cores beside the
    # producer beat leaving the producer its own core, 10.6 s against 12.4 s in all.
    buffer = drafter.start(request.audio)
    with trace.stage("prefill"):
        state = target.prefill(request)
    stats.prefill_s = trace.now()
    root, cursor = target.greedy(state.next_logits)[0], 0
    limit, budget = output_limit(request, target), config.budget or config.as2d_budget or DEFAULT_BUDGET
    while commit_token(root, committed, target.eos_ids, limit, stats):
        with trace.stage("align"):
            buffer.refresh()
            cursor = realign(buffer.tokens, cursor, root, committed[-2] if len(committed) > 1 else None)
            room = min(budget, limit - len(committed), target.max_length - state.length - 1)
            candidates = buffer.ready(cursor + 1, room, CONFIDENCE_THRESHOLD)
        verdict = verify_candidates(
            target,
            state,
            root,
            candidates,
            trace,
            stats,
            lambda logits, candidates=candidates: greedy_verify(target.greedy(logits), candidates),
        )
        if candidates:
            stats.observe_round(len(candidates), verdict.accepted)
        cursor += verdict.accepted + 1
        if not all(commit_token(t, committed, target.eos_ids, limit, stats) for t in candidates[: verdict.accepted]):
            break
        root = verdict.next_token
    stats.decode_s = trace.now() - stats.prefill_s
    drafter.finish(buffer)
    stats.extra = _as2d_figures(trace, buffer, stats, len(committed))
    _record_publications(trace, buffer)
    return DecodeResult(METHOD, committed, stats, trace)


def _record_publications(trace: Trace, buffer: CandidateBuffer) -> None:
    """Each published batch as a trace event, so a saved run can be replayed (profiling/replay.py)."""
    for batch, drained in zip(buffer.batches, buffer.drained_at, strict=True):
        trace.events.append(
            StageEvent(
                "publish",
                batch.started - trace.origin,
                batch.published - trace.origin,
                {
                    "source": batch.source,
                    "offset": batch.offset,
                    "tokens": list(batch.tokens),
                    "confidences": None if batch.confidences is None else list(batch.confidences),
                    "drained_at_refresh": drained,
                },
            )
        )


def _as2d_figures(trace: Trace, buffer: CandidateBuffer, stats: DecodeStats, n_tokens: int) -> dict:
    start, end = stats.prefill_s, stats.prefill_s + stats.decode_s
    producer = [(b.started - trace.origin, b.published - trace.origin) for b in buffer.batches]
    verifier = [(e.start, e.end) for e in trace.events if e.stage in ("align", "verify")]
    first_publication = min((b.published - trace.origin for b in buffer.batches), default=None)
    return {
        "accounting": account(producer, verifier, start, end).as_dict(),
        "published": len(buffer.tokens),
        "producer_failure": buffer.failure,  # the producer errored or died: the rest was decoded target-only
        "stale_batches_dropped": buffer.stale_dropped,
        "used": stats.drafted,
        "coverage": stats.accepted / n_tokens if n_tokens else 0.0,
        "k1_share": stats.call_widths.count(1) / len(stats.call_widths) if stats.call_widths else 0.0,
        # seconds after decoding began (negative: published during the target's prefill)
        "first_publication_s": None if first_publication is None else round(first_publication - start, 4),
        "published_before_decoding": sum(1 for b in buffer.batches if b.published - trace.origin < start),
        "producer_messages_before_end": sum(
            1 for kind, t in buffer.producer_log if kind != "start" and t - trace.origin < end
        ),
        "producer_intervals": [(round(a - start, 4), round(b - start, 4)) for a, b in producer],
        "call_intervals": [
            (round(e.start - start, 4), round(e.end - start, 4)) for e in trace.events if e.stage == "verify"
        ],
    }
