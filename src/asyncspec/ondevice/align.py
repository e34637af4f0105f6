"""Bounded local cursor realignment (seed 000 App. C.3).

The cursor is the stream index believed to hold the target's current root token; candidates are
the tokens after it. Full acceptance moves it by the committed count. After a rejection the
position-based guess (the correction took the rejected candidate's slot) is kept unless the root
itself is found nearby: an insertion or a deletion by the target shifts the match by a few
positions. Nothing here reads or changes the producer: only the cursor moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncspec.ondevice.buffer import CandidateBuffer

CONFIDENCE_THRESHOLD = 0.4  # a source with confidences: stop a proposal after its first less sure token
SEARCH_RADIUS = 8  # positions on each side of the expected slot
WIDE_RADIUS = 48  # second pass: a (previous, root) pair match this far away re-finds a drifted stream


def realign(stream: Sequence[int], expected: int, root: int, previous: int | None, radius: int = SEARCH_RADIUS) -> int:
    """The cursor for `root` near `expected`.

    If the expected slot already holds the root it stays. Otherwise the nearest matching slot
    within the radius (forward first at equal distance), preferring one whose predecessor is the
    previously committed token, so a repeated word does not pull the cursor to the wrong copy.
    No match: the expected slot stays (a substitution keeps the following candidates usable).
    """
    if expected >= len(stream) or stream[expected] == root:
        return expected
    matches = [
        slot
        for distance in range(1, radius + 1)
        for slot in (expected + distance, expected - distance)
        if 0 <= slot < len(stream) and stream[slot] == root
    ]
    with_context = [s for s in matches if previous is not None and s > 0 and stream[s - 1] == previous]
    if with_context or matches:
        return (with_context or matches)[0]
    return _pair_match(stream, expected, root, previous) if previous is not None else expected


def _pair_match(stream: Sequence[int], expected: int, root: int, previous: int) -> int:
    """Nearest slot within WIDE_RADIUS whose token is the root and whose predecessor is `previous`."""
    for distance in range(SEARCH_RADIUS + 1, WIDE_RADIUS + 1):
        for slot in (expected + distance, expected - distance):
            if 0 < slot < len(stream) and stream[slot] == root and stream[slot - 1] == previous:
                return slot
    return expected


class CursorProposer:
    """One request's cursor over its buffer's token stream: realigned to the committed prefix at
    every boundary, the ready candidates after it proposed."""

    def __init__(self, buffer: CandidateBuffer, block_rows: int | None = None):
        self.buffer, self.block_rows, self.cursor = buffer, block_rows, 0

    def propose(self, root: int, committed: list[int], room: int) -> list[int]:
        previous = committed[-2] if len(committed) > 1 else None
        self.cursor = realign(self.buffer.tokens, self.cursor, root, previous)
        return self.buffer.ready(self.cursor + 1, room, CONFIDENCE_THRESHOLD, self.block_rows)

    def advance(self, accepted: int) -> None:
        self.cursor += accepted + 1
