"""As²d: target-decoupled speculative decoding (seed 000 §4, App. C).

A producer drafts from the audio and its own history only, concurrently, and publishes batches
into the candidate buffer. At each boundary the target takes up to `budget` ready candidates at
the cursor, verifies them with its known root in one call, commits the matching prefix and its
own next token, and realigns the cursor. With nothing ready it takes a one-token step: the
target never waits for the producer. The round (`as2d_rounds`) is the one trace replay runs too.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from typing import Protocol

import numpy as np

from asyncspec.decoding.draw_plan import kept_size_costs
from asyncspec.decoding.result import (
    DecodeConfig,
    DecodeResult,
    DecodeStats,
    commit_token,
    observe_prefill,
    output_limit,
)
from asyncspec.decoding.speculative import verify_candidates
from asyncspec.errors import InputError
from asyncspec.models.base import Decoder, DecodeRequest, call_sizes
from asyncspec.models.selftest import require_invariant
from asyncspec.ondevice.accounting import account
from asyncspec.ondevice.buffer import CandidateBuffer, CandidateProposer
from asyncspec.ondevice.call_plan import VerifyPlan
from asyncspec.sampling import decide, token_logprob
from asyncspec.trace import StageEvent, Trace
from asyncspec.verify import Verdict, greedy_verify

METHOD = "as2d"
# Every target call is 8 rows (the fixed-shape engine), so the root and 7 candidates cost what the
# root and 6 did. Measured (issue #29, 2026-12-03, AMD EPYC, bf16): budget 7 reached 99.7 % of the
# per-window oracle on the LibriVox windows against budget 6's 90.3 %, and was faster on the
# real-speech development split and the held-out CMU recordings too; budget 8 needs two calls.
DEFAULT_BUDGET = 7


class Producer(Protocol):
    """Where a request's candidates come from: a producer process, or a long-form window's view of
    the file's publications (ondevice/timed_view.py)."""

    def start(self, audio: np.ndarray) -> CandidateBuffer: ...

    def finish(self, buffer: CandidateBuffer) -> None: ...


class RoundDriver(Protocol):
    """What differs between a native As²d decode and its trace replay (profiling/replay.py): where
    time comes from and who decides the target's tokens. The round itself is `as2d_rounds`."""

    def commit(self, token: int) -> bool: ...  # append a target-approved token; False: decoding ends

    def room(self) -> int: ...  # candidates this round may verify

    def aligning(self) -> AbstractContextManager: ...  # the align stage; drains the buffer on entry

    def verify(self, root: int, candidates: list[int]) -> Verdict: ...

    def round_done(self, last: bool) -> None: ...  # after a round's commits (last: decoding ends)


def as2d_rounds(
    driver: RoundDriver, proposer: CandidateProposer, root: int, committed: list[int], plan: VerifyPlan | None = None
) -> None:
    """The As²d loop: at each boundary realign to the committed prefix, verify up to `room` ready
    candidates after it together with the known root in one call (with a `plan`, those it finds
    worth their call's size), commit the matching prefix and the target's own next token. With
    nothing ready the call is a one-token step."""
    rounds = 0
    while driver.commit(root):
        if rounds:
            driver.round_done(last=False)
        with driver.aligning():
            candidates = proposer.propose(root, committed, driver.room())
            if plan is not None:
                candidates = candidates[: plan.carried(len(candidates))]
        verdict = driver.verify(root, candidates)
        if plan is not None:
            plan.observe(len(candidates), verdict.accepted)
        proposer.advance(verdict.accepted)
        rounds += 1
        if not all(driver.commit(token) for token in candidates[: verdict.accepted]):
            break
        root = verdict.next_token
    if rounds:
        driver.round_done(last=True)


class _NativeRounds:
    """Rounds on the real target: its calls decide, the trace records the time."""

    def __init__(self, target: Decoder, state, buffer: CandidateBuffer, config: DecodeConfig, limit: int, trace: Trace):
        self.target, self.state, self.buffer, self.config, self.limit = target, state, buffer, config, limit
        self.budget = config.budget_for(METHOD, DEFAULT_BUDGET)
        self.trace, self.stats, self.committed = trace, DecodeStats(), list[int]()
        self.first_root = self._decide(state.next_logits[None], 0)[0]
        self.pending_logprobs = [token_logprob(state.next_logits, self.first_root)]  # per token still to commit

    def _decide(self, logits, first_position: int) -> list[int]:
        config = self.config
        return decide(self.target, logits, config.temperature, config.seed, first_position)

    def commit(self, token: int) -> bool:
        self.stats.logprobs.append(self.pending_logprobs.pop(0))
        return commit_token(token, self.committed, self.target.eos_ids, self.limit, self.stats)

    def room(self) -> int:
        return min(self.budget, self.limit - len(self.committed), self.target.max_length - self.state.length - 1)

    @contextmanager
    def aligning(self):
        with self.trace.stage("align"):
            self.buffer.refresh()
            yield

    def verify(self, root: int, candidates: list[int]) -> Verdict:
        target = self.target
        verdict = verify_candidates(
            target,
            self.state,
            root,
            candidates,
            self.trace,
            self.stats,
            lambda logits: self._verdict(logits, candidates),
        )
        if candidates:
            self.stats.observe_round(len(candidates), verdict.accepted)
        return verdict

    def _verdict(self, logits, candidates: list[int]) -> Verdict:
        """Accept while each candidate is the target's own decision at its position (greedy, or
        the positional sample: the same token target-only would draw there)."""
        verdict = greedy_verify(self._decide(logits, len(self.committed)), candidates)
        chosen = [*candidates[: verdict.accepted], verdict.next_token]
        self.pending_logprobs = [token_logprob(logits[i], token) for i, token in enumerate(chosen)]
        return verdict

    def round_done(self, last: bool) -> None:
        pass  # the trace has the time


def decode_as2d(
    target: Decoder, drafter: Producer | None, request: DecodeRequest, config: DecodeConfig
) -> DecodeResult:
    if drafter is None or not hasattr(drafter, "start"):
        raise InputError("as2d needs a producer (a target-decoupled drafter process)")
    if config.temperature > 0 and not config.positional_sampling:
        raise InputError("as2d samples only by position (a long-form window's temperature fallback)")
    require_invariant(target, METHOD)
    # The request arrives: drafting starts now, never before, and runs on its own core while the
    # target encodes the audio and prefills its prompt (it reads only the audio, never target state).
    # Measured (bench e2e, quiet 2-core machine, 15 files): the encoder on both cores beside the
    # producer beat leaving the producer its own core, 10.6 s against 12.4 s in all.
    plan = verify_plan(target)  # before the producer starts: a first run on a machine times the sizes
    trace = Trace()
    buffer = drafter.start(request.audio)
    with trace.stage("prefill"):
        state = target.prefill(request)
    rounds = _NativeRounds(target, state, buffer, config, output_limit(request, target), trace)
    stats = rounds.stats
    stats.prefill_s = trace.now()
    observe_prefill(stats, state)
    sizes = call_sizes(target)
    as2d_rounds(rounds, buffer.make_proposer(sizes), rounds.first_root, rounds.committed, plan)
    stats.decode_s = trace.now() - stats.prefill_s
    drafter.finish(buffer)
    stats.as2d = _as2d_figures(trace, buffer, stats, len(rounds.committed), sizes, plan)
    _record_publications(trace, buffer)
    return DecodeResult(METHOD, rounds.committed, stats, trace)


def verify_plan(target: Decoder) -> VerifyPlan | None:
    """A plan over the target's call sizes where its calls run at several (the int8 engine's proven
    narrow calls); None where one size serves every call that fits (a cut saves nothing) or calls
    take any width."""
    sizes = call_sizes(target)
    if sizes is None or len(sizes) < 2:
        return None
    return VerifyPlan(kept_size_costs(target, lambda: _scratch(target)))


def _scratch(target: Decoder):
    from asyncspec.models.selftest import probe_state

    state = probe_state(target)
    return state.cache, state.length


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


@dataclass(frozen=True)
class As2dFigures:
    """What one As²d decode measured beyond the common stats (its `DecodeStats.as2d`)."""

    accounting: dict  # the D/V/O/H stage accounting (ondevice/accounting.py)
    published: int  # tokens the producer published for the request
    producer_failure: str | None  # the producer errored or died: the rest was decoded target-only
    used: int  # candidates the target verified
    coverage: float  # accepted candidates per committed token
    k1_share: float  # share of one-token calls
    first_publication_s: float | None  # after decoding began (negative: during the target's prefill)
    published_before_decoding: int  # batches published before the target's first round
    producer_messages_before_end: int  # commands about the request the producer read before the end (0)
    producer_intervals: list  # (began, published) per batch, seconds after decoding began
    call_intervals: list  # (start, end) per target call, same clock
    call_sizes: list | None = None  # rows the target's calls could run at (None: any width)
    call_seconds: dict | None = None  # the verify plan's timing per call size (None: no plan)

    def as_dict(self) -> dict:
        return asdict(self)


def _as2d_figures(
    trace: Trace,
    buffer: CandidateBuffer,
    stats: DecodeStats,
    n_tokens: int,
    sizes: tuple[int, ...] | None,
    plan: VerifyPlan | None,
) -> As2dFigures:
    start, end = stats.prefill_s, stats.prefill_s + stats.decode_s
    producer = [(b.started - trace.origin, b.published - trace.origin) for b in buffer.batches]
    verifier = [(e.start, e.end) for e in trace.events if e.stage in ("align", "verify")]
    first_publication = min((b.published - trace.origin for b in buffer.batches), default=None)
    return As2dFigures(
        accounting=account(producer, verifier, start, end).as_dict(),
        published=len(buffer.tokens),
        producer_failure=buffer.failure,
        used=stats.drafted,
        coverage=stats.accepted / n_tokens if n_tokens else 0.0,
        k1_share=stats.call_widths.count(1) / len(stats.call_widths) if stats.call_widths else 0.0,
        first_publication_s=None if first_publication is None else round(first_publication - start, 4),
        published_before_decoding=sum(1 for b in buffer.batches if b.published - trace.origin < start),
        producer_messages_before_end=sum(
            1 for kind, t in buffer.producer_log if kind != "start" and t - trace.origin < end
        ),
        producer_intervals=[(round(a - start, 4), round(b - start, 4)) for a, b in producer],
        call_intervals=[
            (round(e.start - start, 4), round(e.end - start, 4)) for e in trace.events if e.stage == "verify"
        ],
        # what a replay of this decode proposes with (profiling/trajectory.py)
        call_sizes=None if sizes is None else list(sizes),
        call_seconds=None if plan is None else dict(plan.seconds),
    )
