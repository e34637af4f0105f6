"""What the edge keeps per request: confirmed prefix, the open block with its draft state Q_i,
the fidelity budget, and the figures a benchmark needs (TTFT, per-token times, bytes, modes)."""

from __future__ import annotations

import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from asyncspec.cloudedge import logprobs, validation
from asyncspec.cloudedge import protocol as wire
from asyncspec.cloudedge.correction import Ask, CorrectionCounts, CorrectionSession, FidelityBudget
from asyncspec.cloudedge.logprobs import NOT_ASKED, TokenLogprob
from asyncspec.cloudedge.stop_strings import NO_STOP, StopStrings, StopWatch
from asyncspec.decoding.drafter import PrefixDrafter
from asyncspec.sampling import make_generator
from asyncspec.shaping import shaping_problem


@dataclass(frozen=True)
class TokenEvent:
    """A token committed for the request (the target's own, or a verified candidate)."""

    token: int
    logprob: TokenLogprob | None = None  # when the request asked for log-probabilities


@dataclass(frozen=True)
class OutputOptions:
    """What a client asks of the output beside its law: stop strings, log-probabilities."""

    stops: StopStrings = NO_STOP
    logprobs: int = NOT_ASKED  # alternatives per token (0..5), or not asked


@dataclass(frozen=True)
class DoneEvent:
    tokens: tuple[int, ...]
    finish_reason: str  # "eos", "length" or "stop" (a stop string: the last token completes it)
    stats: dict  # RequestStats.as_dict()


@dataclass(frozen=True)
class ErrorEvent:
    message: str
    tokens: tuple[int, ...]  # committed before the failure
    capacity: bool  # refused for lack of room (retry later), not for a fault


EdgeEvent = TokenEvent | DoneEvent | ErrorEvent
NO_OPTIONS = OutputOptions()
Emit = Callable[[EdgeEvent], None]


def event_dict(event: EdgeEvent) -> dict:
    """The event as JSON fields, with its kind under "type" ("token", "done" or "error")."""
    kind = {TokenEvent: "token", DoneEvent: "done", ErrorEvent: "error"}[type(event)]
    fields = {name: list(value) if isinstance(value, tuple) else value for name, value in event.__dict__.items()}
    return {"type": kind, **fields}


@dataclass
class CloudInfo:
    """What the edge learned of its cloud from a Pong."""

    instance: int
    vocab_size: int
    max_length: int


@dataclass
class RequestStats:
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None  # admitted (drafter prefilled, Open sent)
    first_token: float | None = None
    finished: float | None = None
    token_times: list[float] = field(default_factory=list)  # monotonic time each token was committed
    blocks: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    block_bytes: int = 0  # uplink bytes of Block messages (the candidates' cost)
    uplink_bytes: int = 0  # everything sent for this request
    downlink_bytes: int = 0
    resyncs: int = 0
    resubmits: int = 0
    nacks: Counter = field(default_factory=Counter)
    stale_replies: int = 0
    corrections: CorrectionCounts = field(default_factory=CorrectionCounts)
    # runahead only: blocks drafted from an unconfirmed prefix that a verdict then invalidated
    invalidated_blocks: int = 0
    invalidated_tokens: int = 0  # their drafted tokens (guessed bonus + candidates)
    invalidated_uplink_bytes: int = 0
    invalidated_draft_s: float = 0.0
    promoted_blocks: int = 0  # runahead blocks whose presumption held
    max_open_blocks: int = 0  # most blocks of this request open at once
    gammas: Counter = field(default_factory=Counter)  # adaptive block length: block size -> blocks drafted
    accepted_lengths: Counter = field(default_factory=Counter)  # candidates accepted -> blocks settled so

    def settle_block(self, drafted: int, accepted: int) -> None:
        """A verified block's figures: `accepted` of its `drafted` candidates held."""
        self.blocks += 1
        self.drafted += drafted
        self.accepted += accepted
        self.accepted_lengths[accepted] += 1

    def as_dict(self) -> dict:
        start = self.submitted
        return {
            "ttft_s": (self.first_token - start) if self.first_token else None,
            "e2e_s": (self.finished - start) if self.finished else None,
            "token_times_s": [t - start for t in self.token_times],
            "blocks": self.blocks,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance": self.accepted / self.drafted if self.drafted else 0.0,
            "draft_s": self.draft_s,
            "block_bytes": self.block_bytes,
            "uplink_bytes": self.uplink_bytes,
            "downlink_bytes": self.downlink_bytes,
            "uplink_bytes_per_candidate": self.block_bytes / self.drafted if self.drafted else None,
            "resyncs": self.resyncs,
            "resubmits": self.resubmits,
            "nacks": dict(self.nacks),
            "stale_replies": self.stale_replies,
            "corrections": self.corrections.as_dict(),
            "invalidated_blocks": self.invalidated_blocks,
            "invalidated_tokens": self.invalidated_tokens,
            "invalidated_uplink_bytes": self.invalidated_uplink_bytes,
            "invalidated_draft_s": self.invalidated_draft_s,
            "promoted_blocks": self.promoted_blocks,
            "max_open_blocks": self.max_open_blocks,
            "gammas": {str(k): n for k, n in sorted(self.gammas.items())},
            "accepted_lengths": {str(k): n for k, n in sorted(self.accepted_lengths.items())},
        }


@dataclass
class RunningAcceptance:
    """The request's per-candidate acceptance rate, decayed per block so that it follows the text: each
    verdict tests the accepted candidates and, after a rejection, the rejected one (candidates after it
    were never tested). Starts from a prior worth `prior_weight` tested candidates."""

    prior: float = 0.75
    prior_weight: float = 4.0
    hits: float = 0.0
    trials: float = 0.0

    def observe(self, accepted: int, drafted: int, decay: float) -> None:
        tested = accepted + (1 if accepted < drafted else 0)
        self.hits = decay * self.hits + accepted
        self.trials = decay * self.trials + tested

    @property
    def estimate(self) -> float:
        return (self.hits + self.prior * self.prior_weight) / (self.trials + self.prior_weight)


@dataclass
class OpenBlock:
    """A block that waits for the cloud: at most one per request (N_open <= 1)."""

    message: wire.Block
    candidates: list[int]
    q_rows: torch.Tensor | None  # [n, V] the draft state Q_i: stays at the edge
    sent_at: float
    retry_at: float | None = None  # busy back-off
    accepted: int | None = None  # from the verdict
    session: CorrectionSession | None = None
    asked: Ask | None = None  # the correction query in flight
    logprobs: tuple[list[float], list] | None = None  # from the verdict, when asked (logprobs.unpack)
    queries: int = 0  # correction round trips this block's rejection has taken so far
    draft_s: float = 0.0
    size: int = 0  # uplink bytes of its Block message

    @property
    def id(self) -> wire.BlockId:
        return self.message.id


@dataclass
class EdgeRequest:
    id: int
    prompt: tuple[int, ...]
    sampling: wire.Sampling
    max_new_tokens: int
    budget: FidelityBudget
    emit: Emit
    generator: torch.Generator  # the edge's draws: drafting and correction
    drafter: PrefixDrafter | None = None
    generated: list[int] = field(default_factory=list)
    open: OpenBlock | None = None
    ahead: list[OpenBlock] = field(default_factory=list)  # runahead: blocks drafted from an unconfirmed prefix
    invalidated_bases: Counter = field(default_factory=Counter)  # their positions, whose Nacks are expected
    epoch: int = 0
    limit: int = 0
    stats: RequestStats = field(default_factory=RequestStats)
    acceptance: RunningAcceptance = field(default_factory=RunningAcceptance)
    stop_watch: StopWatch | None = None  # the request's stop strings, searched in its committed text
    logprobs: int = NOT_ASKED  # alternatives per token the verdicts carry (logprobs.py)

    def presumed(self) -> list[int]:
        """Generated tokens as runahead presumes them: every open block fully accepted, each bonus guessed."""
        tokens = list(self.generated)
        if self.open is not None:
            tokens += self.open.candidates
        for block in self.ahead:
            tokens += [block.message.root, *block.candidates]
        return tokens

    @property
    def confirmed(self) -> list[int]:
        return [*self.prompt, *self.generated]

    def open_message(self, first_k: int, first_proposals: int = 0) -> wire.Open:
        """What the cloud must prefill: the confirmed prefix without its last token (the next root)."""
        tokens = self.confirmed[:-1]
        return wire.Open(
            self.id,
            wire.pack_ids(tokens),
            len(self.prompt),
            self.sampling.temperature,
            self.sampling.seed,
            first_k,
            self.epoch,
            first_proposals,
            self.sampling.top_p,
            self.sampling.presence_penalty,
            self.sampling.frequency_penalty,
            self.logprobs,
        )


def new_request(
    prompt_ids,
    max_new_tokens: int,
    sampling: wire.Sampling,
    eps_req: float,
    emit: Emit,
    output: OutputOptions = NO_OPTIONS,
    decode=None,  # token ids -> text: how the stop strings are searched
) -> EdgeRequest:
    """A submission, validated (ValueError says what is wrong), under an unpredictable id: another
    peer cannot guess it and touch the request."""
    if not prompt_ids:
        raise ValueError("the prompt is empty")
    if not 0 <= eps_req <= 1 or max_new_tokens < 1:
        raise ValueError("eps_req must be within [0, 1] and max_new_tokens >= 1")
    problem = validation.sampling_problem(sampling.temperature, sampling.seed) or shaping_problem(
        sampling.top_p, sampling.presence_penalty, sampling.frequency_penalty
    )
    if problem:
        raise ValueError(problem)
    if output.logprobs != NOT_ASKED and not 0 <= output.logprobs <= validation.MAX_TOP_LOGPROBS:
        raise ValueError(f"logprobs must be within [0, {validation.MAX_TOP_LOGPROBS}]")
    request = EdgeRequest(
        secrets.randbits(64),
        tuple(int(t) for t in prompt_ids),
        sampling,
        max_new_tokens,
        FidelityBudget(eps_req),
        emit,
        make_generator((sampling.seed + 0x5EED) % 2**64),  # the edge's own stream, independent of the cloud's
        logprobs=output.logprobs,
    )
    if output.stops.strings:
        request.stop_watch = StopWatch(output.stops, decode)
    return request


def checked_verdict(verdict: wire.Verdict, block: OpenBlock, top: int) -> tuple[list[float], list] | None:
    """The verdict's log-probabilities (None when not asked); ValueError when the verdict is impossible."""
    if not 0 <= verdict.accepted <= len(block.candidates) - (verdict.token < 0):
        raise ValueError("more accepted candidates than the block has")
    return logprobs.unpack(verdict, top) if top != NOT_ASKED else None


def commit(request: EdgeRequest, tokens: list[int], eos_ids, entries: list[TokenLogprob] | None = None) -> str | None:
    """Commit verified tokens in order (with their log-probabilities when asked), emitting each; the
    finish reason as soon as one ends the request (an end of sequence, itself not committed; a stop
    string; the length limit), else None."""
    stats = request.stats
    for index, token in enumerate(tokens):
        if token in eos_ids:
            return "eos"
        request.generated.append(token)
        now = time.monotonic()
        stats.token_times.append(now)
        stats.first_token = stats.first_token or now
        request.emit(TokenEvent(token, entries[index] if entries else None))
        if request.stop_watch is not None and request.stop_watch.add(token):
            return "stop"  # the cloud closes the request at the cut
        if len(request.generated) >= request.limit:
            return "length"
    return None
