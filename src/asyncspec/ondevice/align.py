"""Bounded local cursor realignment (seed 000 App. C.3).

The cursor is the stream index believed to hold the target's current root token; candidates are
the tokens after it. Full acceptance moves it by the committed count. After a rejection the
position-based guess (the correction took the rejected candidate's slot) is kept unless the root
itself is found nearby (an insertion or a deletion by the target shifts the match by a few
positions), the committed context further away, or the root spelt otherwise beside the guess
(`realign`). Nothing here reads or changes the producer: only the cursor moves.

Replayed on the large long-form set's final publications (50 windows, 8 recordings), the two
later passes cut the target's calls from 1,833 to 1,773, fewer on every recording; an oracle that
knew the target's next tokens would need 1,467.
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from asyncspec.ondevice.buffer import CandidateBuffer

CONFIDENCE_THRESHOLD = 0.4  # a source with confidences: stop a proposal after its first less sure token
SEARCH_RADIUS = 8  # positions on each side of the expected slot
WIDE_RADIUS = 48  # second pass: a match of the committed context this far away re-finds a drifted stream
FUZZY_RADIUS = 2  # third pass: slots on each side of the expected one where a root spelt otherwise is looked for
FUZZY_RATIO = 0.6  # difflib's similarity of two spellings that count as one word heard alike
CONTEXT_TOKENS = 12  # committed tokens the context match compares


def realign(
    stream: Sequence[int],
    expected: int,
    root: int,
    history: Sequence[int],
    *,
    complete: bool = False,
    spelling: Callable[[int], str] | None = None,
    radius: int = SEARCH_RADIUS,
) -> int:
    """The cursor for `root` near `expected`. `history`: the committed text tokens, the root last;
    `complete`: the producer has published all of the stream; `spelling`: a token's letters, to
    recognise a word the producer spelt otherwise.

    - The expected slot holds the root, or lies past the end of a stream still growing (the producer
      has not got there yet): it stays.
    - The nearest slot within the radius holding the root (forward first at equal distance),
      preferring one whose predecessor is the previous committed token, so a repeated word does not
      pull the cursor to the wrong copy.
    - The slot within WIDE_RADIUS whose tokens end with the longest run of the committed context
      (at least the root and its predecessor), the nearest at equal length: a drifted stream is
      re-found, and a later pair that matches less of the context does not pull the cursor away
      (a window jumped 48 tokens to the end of its stream on a two-token match and was given no
      candidate for its last 45 tokens). Past the end of a complete stream this is how the cursor
      comes back.
    - With `spelling`, the nearest slot within FUZZY_RADIUS whose token is spelt like the root: the
      producer heard the word and wrote it otherwise (" hair" for " hare", " Tort" for " torto").
    - Else the expected slot: a substitution keeps the following candidates usable.
    """
    if (expected < len(stream) and stream[expected] == root) or (expected >= len(stream) and not complete):
        return expected
    previous = history[-2] if len(history) > 1 else None
    matches = [slot for slot in _slots_near(expected, radius, len(stream)) if stream[slot] == root]
    with_context = [s for s in matches if previous is not None and s > 0 and stream[s - 1] == previous]
    if with_context or matches:
        return (with_context or matches)[0]
    context = _context_match(stream, expected, history)
    if context is not None:
        return context
    alike = _spelt_alike(stream, expected, root, spelling) if spelling is not None else None
    return expected if alike is None else alike


def _context_match(stream: Sequence[int], expected: int, history: Sequence[int]) -> int | None:
    """The slot within WIDE_RADIUS holding the root whose preceding tokens match the most of the
    committed context (two at least), the nearest among equals, forward first."""
    best: tuple[int, int] | None = None  # (context matched, -distance)
    slot_found = None
    for slot in range(max(expected - WIDE_RADIUS, 0), min(expected + WIDE_RADIUS + 1, len(stream))):
        matched = 0
        while matched < len(history) and slot - matched >= 0 and stream[slot - matched] == history[-1 - matched]:
            matched += 1
        key = (matched, -abs(slot - expected))
        if matched >= 2 and (best is None or key >= best):  # >=: a later slot wins a tie
            best, slot_found = key, slot
    return slot_found


def _spelt_alike(stream: Sequence[int], expected: int, root: int, spelling: Callable[[int], str]) -> int | None:
    """The nearest slot within FUZZY_RADIUS of `expected` (itself first) whose token is spelt like the root."""
    near = _slots_near(expected, FUZZY_RADIUS, len(stream), nearest=0)
    return next((slot for slot in near if spelt_alike(spelling(stream[slot]), spelling(root))), None)


def _slots_near(expected: int, radius: int, length: int, nearest: int = 1) -> Iterator[int]:
    """Slots of a stream of `length` from `nearest` to `radius` away from `expected`, nearest first,
    forward first at equal distance."""
    for distance in range(nearest, radius + 1):
        for slot in (expected + distance, expected - distance) if distance else (expected,):
            if 0 <= slot < length:
                yield slot


def spelt_alike(a: str, b: str) -> bool:
    """Two spellings of one heard word: one begins the other (three letters at least), or difflib
    finds them FUZZY_RATIO alike."""
    if not a or not b:
        return False
    if min(len(a), len(b)) >= 3 and (a.startswith(b) or b.startswith(a)):
        return True
    return difflib.SequenceMatcher(None, a, b).ratio() >= FUZZY_RATIO


def token_spelling(tokenizer) -> Callable[[int], str]:
    """A token's letters and digits, case-folded (" Tort," -> "tort"), cached per token."""

    @functools.lru_cache(maxsize=65536)
    def spelling(token: int) -> str:
        return "".join(character for character in tokenizer.decode([token]).casefold() if character.isalnum())

    return spelling


class CursorProposer:
    """One request's cursor over its buffer's token stream: realigned to the committed prefix at
    every boundary, the ready candidates after it proposed."""

    def __init__(self, buffer: CandidateBuffer, call_sizes: Sequence[int] | None = None):
        self.buffer, self.call_sizes, self.cursor = buffer, call_sizes, 0

    def propose(self, root: int, committed: list[int], room: int) -> list[int]:
        history = committed[-CONTEXT_TOKENS:]
        self.cursor = realign(self.buffer.tokens, self.cursor, root, history, complete=self.buffer.finished)
        return self.buffer.ready(self.cursor + 1, room, CONFIDENCE_THRESHOLD, self.call_sizes)

    def advance(self, accepted: int) -> None:
        self.cursor += accepted + 1
