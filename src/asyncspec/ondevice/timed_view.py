"""As²d across long-form seeks: one producer request drafts the whole recording; each target window
reads a view of it from the window's start on.

The producer is started once with the file's audio and transcribes it chunk by chunk, publishing
each chunk's tokens tagged with the chunk's audio time. It never learns where the target seeked:
a window at seek s takes, on the target side, the published tokens estimated at or after s (a
token's time is interpolated inside its chunk; a margin keeps words that straddle s). Timestamp
tokens are the target's: the proposer skips them in the text stream, and proposes that a segment
that just closed at t opens the next one at t, as Whisper's segments mostly do.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from asyncspec.models.whisper_rules import TimestampRules
from asyncspec.ondevice.align import CONFIDENCE_THRESHOLD, CONTEXT_TOKENS, realign
from asyncspec.ondevice.buffer import CandidateBuffer, PublishedBatch
from asyncspec.ondevice.messages import Done, Failed

EARLY_MARGIN_S = 1.0  # a token estimated this much before the seek may still be the window's first word


class FileCandidates:
    """The whole recording's publications (one producer request), and a view per target window."""

    def __init__(
        self, producer, audio: np.ndarray, rules: TimestampRules, spelling: Callable[[int], str] | None = None
    ):
        """`spelling`: a target token's letters (align.token_spelling), to realign across words the
        producer spelt otherwise."""
        self.producer, self.rules, self.spelling = producer, rules, spelling
        self.buffer = producer.start(audio)  # the producer reads the file's audio, nothing else
        self._views = 0

    def window(self, seek_s: float, end_s: float) -> WindowCandidates:
        self._views += 1
        return WindowCandidates(self, seek_s, end_s, self._views)

    def drafting_done(self) -> bool:
        """Whether the producer has published all it will for the file (it is idle now)."""
        self.buffer.refresh()
        return self.buffer.finished

    def close(self, complete: bool = False, timeout_s: float = 600.0) -> None:
        """Stop the file's drafting; with `complete`, first let the producer publish all of it
        (a decoupling test compares whole publications)."""
        deadline = time.monotonic() + timeout_s
        while complete and not self.buffer.finished and time.monotonic() < deadline:
            if self.buffer.channel is None or not self.buffer.channel.poll(0.5):
                continue
            self.buffer.accept(self.buffer.channel.recv())
        self.producer.finish(self.buffer)


class WindowCandidates:
    """A decode method's producer for one window (decoding/as2d.py's `Producer`): `start` gives the
    window's buffer; `finish` leaves the file's drafting running for the windows after it."""

    def __init__(self, source: FileCandidates, seek_s: float, end_s: float, view_id: int):
        self.source, self.seek_s, self.end_s, self.view_id = source, seek_s, end_s, view_id

    def start(self, audio: np.ndarray) -> CandidateBuffer:
        channel = _WindowChannel(self.source.buffer, self.view_id, self.seek_s, self.end_s)
        return WindowBuffer(self.view_id, channel, self.source.rules, self.source.spelling)

    def finish(self, buffer: CandidateBuffer) -> None:
        buffer.refresh()


class WindowBuffer(CandidateBuffer):
    """A window's candidates: text tokens only, proposed around the target's timestamps."""

    def __init__(self, request_id: int, channel, rules: TimestampRules, spelling: Callable[[int], str] | None = None):
        super().__init__(request_id, channel)
        self.rules, self.spelling = rules, spelling

    def make_proposer(self, call_sizes: Sequence[int] | None = None) -> TimestampProposer:
        return TimestampProposer(self, self.rules, call_sizes, self.spelling)


class TimestampProposer:
    """The cursor over a window's text stream. It holds the stream index of the last committed text
    token; timestamps the target commits leave it where it is."""

    def __init__(
        self,
        buffer: CandidateBuffer,
        rules: TimestampRules,
        call_sizes: Sequence[int] | None = None,
        spelling: Callable[[int], str] | None = None,
    ):
        self.buffer, self.rules, self.call_sizes, self.spelling = buffer, rules, call_sizes, spelling
        self.cursor = -1  # no text committed yet: the first candidate is the stream's first token
        self.proposal: list[int] = []

    def propose(self, root: int, committed: list[int], room: int) -> list[int]:
        is_ts = self.rules.is_timestamp
        guess: list[int] = []
        if not is_ts(root):
            history = [token for token in committed[-CONTEXT_TOKENS:] if not is_ts(token)]
            stream, complete = self.buffer.tokens, self.buffer.finished
            self.cursor = realign(stream, self.cursor + 1, root, history, complete=complete, spelling=self.spelling)
        elif len(committed) > 1 and not is_ts(committed[-2]):
            guess = [root]  # root closed a segment: guess the next one opens at the same time
        text = (
            self.buffer.ready(self.cursor + 1, room - len(guess), CONFIDENCE_THRESHOLD, self.call_sizes)
            if room > len(guess)
            else []
        )
        self.proposal = (guess + text)[:room]
        return self.proposal

    def advance(self, accepted: int) -> None:
        self.cursor += sum(1 for token in self.proposal[:accepted] if not self.rules.is_timestamp(token))


class _WindowChannel:
    """The window's batches, re-based from the file's stream: batches that end after the seek and
    start before the window's end, the first one trimmed to tokens estimated near or after the seek."""

    def __init__(self, file_buffer: CandidateBuffer, request_id: int, seek_s: float, end_s: float):
        self.file, self.request_id, self.seek_s, self.end_s = file_buffer, request_id, seek_s, end_s
        self.read, self.offset, self.done = 0, 0, False
        self.pending: deque = deque()

    def poll(self, timeout: float = 0.0) -> bool:
        if not self.pending:
            self._pull()
        return bool(self.pending)

    def recv(self) -> object:
        return self.pending.popleft()

    def _pull(self) -> None:
        self.file.refresh()
        for batch in self.file.batches[self.read :]:
            self.read += 1
            tokens = self._tokens_in_window(batch)
            if tokens:
                self.pending.append(self._rebased(batch, tokens))
        if self.file.finished and not self.done:
            self.done = True
            if self.file.failure is not None:
                self.pending.append(Failed(self.request_id, self.file.failure))
            self.pending.append(Done(self.request_id, time.perf_counter(), ()))

    def _tokens_in_window(self, batch: PublishedBatch) -> tuple[int, ...]:
        if batch.start_s is None or batch.end_s is None:
            return batch.tokens  # an untimed source: all of it may matter
        if batch.end_s <= self.seek_s - EARLY_MARGIN_S or batch.start_s >= self.end_s:
            return ()
        if self.offset or batch.start_s >= self.seek_s - EARLY_MARGIN_S:
            return batch.tokens
        step = (batch.end_s - batch.start_s) / max(len(batch.tokens), 1)
        first = next(
            (i for i in range(len(batch.tokens)) if batch.start_s + i * step >= self.seek_s - EARLY_MARGIN_S),
            len(batch.tokens),
        )
        return batch.tokens[first:]

    def _rebased(self, batch: PublishedBatch, tokens: tuple[int, ...]) -> PublishedBatch:
        skipped = len(batch.tokens) - len(tokens)
        confidences = None if batch.confidences is None else batch.confidences[skipped:]
        rebased = replace(batch, request_id=self.request_id, offset=self.offset, tokens=tokens, confidences=confidences)
        self.offset += len(tokens)
        return rebased
