"""The ordered candidate buffer between a producer and the target.

The producer appends immutable batches (one publication each); the target drains whatever has
arrived without blocking (`refresh`, microseconds when nothing is new) and reads candidates from
the flat token stream at a cursor that only alignment moves. Provenance stays with each batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from asyncspec.ondevice.messages import Done, Failed


@dataclass(frozen=True)
class PublishedBatch:
    request_id: int
    source: str  # e.g. "ct2-chunk" or "autoregressive"
    offset: int  # index of the batch's first token in the request's stream
    tokens: tuple[int, ...]  # target-vocabulary ids
    confidences: tuple[float, ...] | None  # drafter probability per token, when the source has it
    started: float  # perf_counter time the producer began this batch's work
    published: float  # perf_counter time it was handed to the buffer
    start_s: float | None = None  # the audio it drafted from, in seconds of the request's audio
    end_s: float | None = None


class CandidateProposer(Protocol):
    """Which published candidates the target verifies next, given what it has committed."""

    def propose(self, root: int, committed: list[int], room: int) -> list[int]: ...

    def advance(self, accepted: int) -> None:
        """The last proposal's first `accepted` candidates were committed, then the target's own token."""
        ...


class BatchChannel(Protocol):
    def poll(self, timeout: float = 0.0) -> bool: ...

    def recv(self) -> object: ...


def paid_for(candidates: int, call_sizes: Sequence[int] | None) -> int:
    """The candidates a call carrying the root and `candidates` could carry at the same cost: its
    rows rounded up to the smallest call size holding them (past the widest, to whole calls of
    it), less the root (`candidates` itself where calls take any width)."""
    if not call_sizes:
        return candidates
    rows = candidates + 1
    holding = [size for size in call_sizes if size >= rows]
    if holding:
        return min(holding) - 1
    widest = max(call_sizes)
    return -(-rows // widest) * widest - 1


class CandidateBuffer:
    """One request's published candidates, in order. Only the consumer (target side) touches it."""

    def __init__(self, request_id: int, channel: BatchChannel | None = None):
        self.request_id = request_id
        self.channel = channel
        self.batches: list[PublishedBatch] = []
        self.tokens: list[int] = []
        self.confidences: list[float | None] = []
        self.publish_times: list[float] = []
        self.finished = False  # the producer has published everything it will for this request
        self.failure: str | None = None  # why the producer stopped early (it errored or died), if it did
        self.producer_log: list[tuple[str, float]] = []  # what the producer received, and when
        self.refreshes = 0  # refresh() calls so far
        self.drained_at: list[int] = []  # per batch: the refresh() call (1-based) that delivered it

    def refresh(self) -> int:
        """Drain what the producer has sent, without waiting; returns the new token count."""
        before = len(self.tokens)
        self.refreshes += 1
        try:
            while not self.finished and self.channel is not None and self.channel.poll(0):
                self.accept(self.channel.recv())
        except (EOFError, OSError) as error:  # the producer died: keep what it published
            self.fail(f"the producer died ({type(error).__name__})")
        return len(self.tokens) - before

    def fail(self, reason: str) -> None:
        """The producer will publish nothing more for this request: the target decodes on alone."""
        self.failure = self.failure or reason
        self.finished = True

    def accept(self, message: object) -> None:
        if isinstance(message, PublishedBatch):
            self.publish(message)
        elif isinstance(message, Failed):
            if message.request_id == self.request_id:
                self.failure = message.reason
        elif isinstance(message, Done):
            if message.request_id == self.request_id:
                self.finished = True
                self.producer_log = list(message.received)
        else:
            raise TypeError(f"unexpected message on the candidate channel: {message!r}")

    def publish(self, batch: PublishedBatch) -> None:
        if batch.request_id != self.request_id:
            raise ValueError(f"batch of request {batch.request_id} routed to request {self.request_id}")
        if batch.offset != len(self.tokens):
            raise ValueError(f"batch at offset {batch.offset} after {len(self.tokens)} published tokens")
        self.batches.append(batch)
        self.drained_at.append(self.refreshes)
        self.tokens.extend(batch.tokens)
        self.confidences.extend(batch.confidences or [None] * len(batch.tokens))
        self.publish_times.extend([batch.published] * len(batch.tokens))

    def make_proposer(self, call_sizes: Sequence[int] | None = None) -> CandidateProposer:
        """`call_sizes`: the rows a target call may run at (models.base.call_sizes), or None."""
        from asyncspec.ondevice.align import CursorProposer

        return CursorProposer(self, call_sizes)

    def ready(
        self, start: int, limit: int, min_confidence: float | None = None, call_sizes: Sequence[int] | None = None
    ) -> list[int]:
        """Up to `limit` published tokens from `start`; with confidences, stop after the first
        token below min_confidence (that token included, as in ASP). With `call_sizes`, the
        tokens that still fit in the rows the call pays for anyway are kept: a fixed-shape call
        runs the root and the candidates padded to one of its sizes, so a cut inside a size saves
        nothing and only drops candidates that might have been accepted."""
        if start < 0:
            return []
        window = self.tokens[start : start + max(limit, 0)]
        if min_confidence is None:
            return window
        for i, confidence in enumerate(self.confidences[start : start + len(window)]):
            if confidence is not None and confidence < min_confidence:
                return window[: paid_for(i + 1, call_sizes)]
        return window
