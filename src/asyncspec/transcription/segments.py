"""A window's output tokens as timed segments, and where the next window starts (Whisper's seek).

A window decoded with timestamps reads `<|t0|> text <|t1|><|t1|> text <|t2|> ...`. Every pair of
consecutive timestamps closes a segment. If the window ends on a lone timestamp, the speech in it
is complete and the next window starts after it; otherwise the last segment is unfinished (cut by
the window's end), is dropped here, and the next window starts at the last complete timestamp, so
the cut speech is decoded again in full rather than lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from asyncspec.models.whisper_rules import TimestampRules

FRAMES_PER_SECOND = 100  # log-mel frames (10 ms hop)
FRAMES_PER_TIMESTAMP = 2  # a timestamp token is 20 ms: two mel frames


@dataclass(frozen=True)
class Segment:
    """One timed piece of a transcript (seconds from the start of the recording)."""

    id: int
    seek: int  # mel frame where the window that produced it started
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]  # the window's output tokens of this segment, timestamps included
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    temperature: float
    window: int = 0  # index of the decoded window
    words: list | None = field(default=None, compare=False)

    def as_dict(self) -> dict:
        return asdict(self) | {"tokens": list(self.tokens)}


@dataclass(frozen=True)
class TimedPiece:
    start: float
    end: float
    tokens: tuple[int, ...]


def split_by_timestamps(
    rules: TimestampRules, tokens: Sequence[int], offset_s: float, seek: int, size: int
) -> tuple[list[TimedPiece], int]:
    """The window's complete segments and the next seek (mel frames), as faster-whisper and
    openai-whisper split them. `size` is the window's length in frames."""
    is_ts = rules.is_timestamp
    single_ending = len(tokens) >= 2 and not is_ts(tokens[-2]) and is_ts(tokens[-1])
    cuts = [i for i in range(1, len(tokens)) if is_ts(tokens[i]) and is_ts(tokens[i - 1])]
    if not cuts:  # no complete pair: the whole window is one segment
        stamps = [t for t in tokens if is_ts(t)]
        end = rules.seconds(stamps[-1]) if stamps and stamps[-1] != rules.timestamp_begin else size / FRAMES_PER_SECOND
        return [TimedPiece(offset_s, offset_s + end, tuple(tokens))], seek + size
    if single_ending:
        cuts.append(len(tokens))
    pieces, last = [], 0
    for cut in cuts:
        piece = tokens[last:cut]
        pieces.append(TimedPiece(offset_s + rules.seconds(piece[0]), offset_s + rules.seconds(piece[-1]), tuple(piece)))
        last = cut
    if single_ending:
        return pieces, seek + size
    return pieces, seek + (tokens[last - 1] - rules.timestamp_begin) * FRAMES_PER_TIMESTAMP


def unfinished_piece(
    rules: TimestampRules, tokens: Sequence[int], pieces: Sequence[TimedPiece], offset_s: float, end_s: float
) -> list[TimedPiece]:
    """The tokens past `pieces` (what `split_by_timestamps` leaves to the next window) as one
    piece from its opening timestamp to `end_s`, where they hold any text; else nothing."""
    rest = tuple(tokens[sum(len(piece.tokens) for piece in pieces) :])
    if not any(not rules.is_timestamp(t) for t in rest):
        return []
    start = offset_s + rules.seconds(rest[0]) if rules.is_timestamp(rest[0]) else offset_s
    return [TimedPiece(min(start, end_s), end_s, rest)]


def text_of(tokenizer, rules: TimestampRules, tokens: Sequence[int]) -> str:
    """The words of a segment (timestamps are ordinary added tokens in Whisper's tokenizer)."""
    return tokenizer.decode([t for t in tokens if not rules.is_timestamp(t)])
