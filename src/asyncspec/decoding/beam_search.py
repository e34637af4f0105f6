"""Beam search as faster-whisper runs it (CTranslate2's BeamSearch), one hypothesis per engine row.

The rule is CTranslate2's, so that `--beam-size 5` means what it means to a faster-whisper user:
every step takes the 2 x beam best (beam, token) continuations by cumulative log-probability;
the first `beam` of them are kept, except that one ending in end-of-text (or at the length limit)
is set aside as a finished hypothesis and replaced by the next unfinished continuation; the
search stops at the length limit, once round(beam x patience) hypotheses have finished, or, with
a length penalty of 0, once the best continuation has finished. A finished hypothesis scores its
summed log-probability over len(tokens) ** length_penalty and the best score is returned.

Every live hypothesis is one row of one call: `KVBackend.extend_each` packs the beams side by side
into the engine's 8-row blocks, and a row's logits never depend on the call that computed them
(models/fixed_shape.py), so the search in one call per step finds bitwise the hypotheses and
scores it finds with each hypothesis in a call of its own (`one_call_per_row`), at about the
price of greedy decoding. Where the invariance self-test fails on this machine the beams are
decoded one call each instead: slower, the same search.

A hypothesis that continues on its parent's state takes it; the others are copied into the state
of a beam that left no continuation (only the rows so far), so a step copies at most beam - 1
prefixes and allocates nothing once the beams are formed.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field, replace

import torch

from asyncspec.decoding.lockstep import RowCalls, Rows, Search, drive, proven_calls
from asyncspec.decoding.result import DecodeConfig, DecodeResult, DecodeStats, observe_prefill, output_limit
from asyncspec.models.base import Decoder, DecodeRequest, DecoderState
from asyncspec.trace import Trace

METHOD = "target"  # beam search is decoded by the target alone: the reference for every method


@dataclass
class _Beam:
    tokens: list[int]  # output so far; the last one is not in `state` yet
    score: float  # summed log-probability of `tokens` (float64)
    logprobs: list[float]  # each token's log-probability, in order
    state: DecoderState | None = None
    row: torch.Tensor | None = None  # float32 [V]: the logits that score its continuations


@dataclass
class _Finished:
    tokens: list[int]
    logprobs: list[float]  # the end of text's included where it ended on it
    score: float  # normalised by the length penalty
    ended_on_eos: bool


@dataclass
class _Continuation:
    parent: int  # index into the current beams
    token: int
    score: float
    logprob: float


@dataclass
class BeamSearch:
    """One request's search; `steps` yields each step's beams as rows and returns the best hypothesis."""

    target: Decoder
    beam_size: int
    patience: float = 1.0
    length_penalty: float = 1.0
    finished: list[_Finished] = field(default_factory=list)

    def __post_init__(self):
        if self.beam_size < 1:
            raise ValueError(f"beam size must be at least 1, got {self.beam_size}")
        if self.patience <= 0:
            raise ValueError(f"patience must be above 0, got {self.patience}")
        self.most_finished = max(1, round(self.beam_size * self.patience))

    def steps(
        self, state: DecoderState, limit: int, stats: DecodeStats, trace: Trace
    ) -> Generator[Rows, list[torch.Tensor], _Finished]:
        eos = self.target.eos_ids
        beams = [_Beam([], 0.0, [], state, state.next_logits)]
        top_finished = False
        limit = max(limit, 1)  # greedy decoding decides one token whatever the limit
        for step in range(limit):
            continuations = self._continuations(beams)
            last_step = step + 1 == limit
            kept, secondary = [], self.beam_size
            for k, candidate in enumerate(continuations[: self.beam_size]):
                if candidate.token in eos or last_step:
                    top_finished |= k == 0
                    self._finish(beams[candidate.parent], candidate, candidate.token in eos)
                    for j in range(secondary, len(continuations)):  # the next unfinished one takes its place
                        if continuations[j].token not in eos:
                            candidate, secondary = continuations[j], j + 1
                            break
                kept.append(candidate)
            if last_step or self._done(top_finished):
                break
            beams = yield from self._step(beams, kept, stats, trace)
        return max(self.finished, key=lambda hypothesis: hypothesis.score)  # the first of equals, as sorted

    def _continuations(self, beams: list[_Beam]) -> list[_Continuation]:
        """The 2 x beam best (beam, token) by summed log-probability, best first. A beam's score is
        one number added to all its row, so the best overall are among each row's own 2 x beam best:
        those few are ranked, not the whole beam x vocabulary (a top-k over 5 x 51,865 scores took
        0.6 ms a step on a 2-core Zen 3, of ~11 ms)."""
        wanted = 2 * self.beam_size
        out = []
        for parent, beam in enumerate(beams):
            logp = torch.log_softmax(beam.row.clone(), dim=-1)
            values, tokens = logp.topk(min(wanted, logp.numel()))
            for value, token in zip(values.tolist(), tokens.tolist(), strict=True):
                out.append(_Continuation(parent, token, beam.score + value, value))
        # best first; among equal scores the earlier beam, then the lower token, as a flat top-k finds them
        out.sort(key=lambda c: (-c.score, c.parent, c.token))
        return out[:wanted]

    def _finish(self, beam: _Beam, candidate: _Continuation, on_eos: bool) -> None:
        tokens = beam.tokens if on_eos else [*beam.tokens, candidate.token]
        logprobs = [*beam.logprobs, candidate.logprob]
        length = float(len(tokens)) ** self.length_penalty
        score = candidate.score / length if length > 0 else float("-inf")
        self.finished.append(_Finished(list(tokens), logprobs, score, on_eos))

    def _done(self, top_finished: bool) -> bool:
        if self.length_penalty == 0:  # CTranslate2's early exit: no penalty can reorder them later
            return top_finished and len(self.finished) >= 1
        return len(self.finished) >= self.most_finished

    def _step(
        self, beams: list[_Beam], kept: list[_Continuation], stats: DecodeStats, trace: Trace
    ) -> Generator[Rows, list[torch.Tensor], list[_Beam]]:
        """The kept continuations as the next beams, each on a state holding its parent's rows,
        their new tokens asked for as one step's rows (one call, or one call each)."""
        parents = {c.parent for c in kept}
        spare = [beam.state for i, beam in enumerate(beams) if i not in parents]
        states: list[DecoderState | None] = []
        for candidate in kept:  # first a parent's own state for one child ...
            own = candidate.parent not in {c.parent for c in kept[: len(states)]}
            states.append(beams[candidate.parent].state if own else None)
        for i, candidate in enumerate(kept):  # ... then copies, before any state is extended
            if states[i] is None:
                source = beams[candidate.parent].state
                states[i] = _copied(self.target, source, spare.pop() if spare else None)
        new = [
            _Beam([*beams[c.parent].tokens, c.token], c.score, [*beams[c.parent].logprobs, c.logprob], state)
            for c, state in zip(kept, states, strict=True)
        ]
        ready = [beam.state for beam in new if beam.state is not None]
        with trace.stage("verify", width=len(new)):
            rows = yield list(zip(ready, [beam.tokens[-1] for beam in new], strict=True))
        stats.target_calls += 1
        stats.call_widths.append(len(new))
        for beam, row in zip(new, rows, strict=True):
            beam.row = row
        return new


def _copied(target, source: DecoderState | None, into: DecoderState | None) -> DecoderState:
    if source is None:
        raise RuntimeError("beam search: a kept continuation has no parent state")
    if into is None:
        return target.copy_state(source)
    target.copy_state_into(source, into)
    return into


def decode_beam_search(
    target: Decoder, request: DecodeRequest, config: DecodeConfig, calls: RowCalls | None = None
) -> DecodeResult:
    """The best hypothesis of a beam search with config's beam_size, patience and length_penalty
    (`beam_search`), its beams side by side in one call a step where the invariance self-test
    passed, else one call each (or as `calls` says)."""
    return drive(target, [beam_search(target, request, config)], calls or proven_calls(target))[0]


def decode_beam_batch(target: Decoder, requests: list[DecodeRequest], config: DecodeConfig) -> list[DecodeResult]:
    """Each request's beam search as `decode_beam_search` runs it alone, the searches side by side
    (decoding/lockstep.py): bitwise each one's result alone."""
    return drive(target, [beam_search(target, request, config) for request in requests], proven_calls(target))


def beam_search(target: Decoder, request: DecodeRequest, config: DecodeConfig) -> Search:
    """The request's beam search as a lockstep search, its result a DecodeResult whose logprobs
    are the best hypothesis' own (Whisper's avg_logprob reads them). Word timestamps
    (request.attention): the chosen hypothesis' rows are computed once more in a state that
    records them, bitwise the rows the search computed."""
    trace, stats = Trace(), DecodeStats()
    search = BeamSearch(target, config.beam_size, config.patience, config.length_penalty)
    with trace.stage("prefill"):
        state = target.prefill(replace(request, attention=None))
    stats.prefill_s = trace.now()
    observe_prefill(stats, state)
    best = yield from search.steps(state, output_limit(request, target), stats, trace)
    stats.logprobs = best.logprobs
    stats.finish_reason = "eos" if best.ended_on_eos else "length"
    stats.notes["beam_size"] = config.beam_size
    stats.notes["hypotheses_finished"] = len(search.finished)
    if request.attention is not None:
        with trace.stage("record"):
            recording = target.prefill(request)
            if len(best.tokens) > 1:
                target.extend(recording, best.tokens[:-1])
    stats.decode_s = trace.now() - stats.prefill_s
    return DecodeResult(METHOD, best.tokens, stats, trace)
