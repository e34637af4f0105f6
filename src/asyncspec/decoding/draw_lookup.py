"""Candidates for a fallback draw, looked up in what the window's decoding has already produced.

A window falls back when its text is too repetitive or too unlikely, and its draws at the next
temperature mostly retrace the earlier attempts (on the long-form set, 450 of 525 tokens of the
first fallback's five draws continued a phrase of the greedy attempt). So a draw's next tokens are
proposed as the continuation after the latest earlier occurrence of its own last n tokens
(n = LONGEST..1): first in the window's earlier attempts, the first listed winning, then in the
draw's own output so far. Nothing here decides a token: the target accepts a candidate only where
it equals the draw's own positional sample (speculative_draws.py).
"""

from __future__ import annotations

from collections.abc import Sequence

# The longest suffix looked up: replaying readers.wav's fallback draws, the modelled chain took
# 6.94 s with 2, 6.28 s with 4, 6.08 s with 6 and the same with 8 or 12.
LONGEST = 6
Entries = dict[tuple[int, ...], tuple[Sequence[int], int]]  # n-gram -> (the sequence, where it continues)


def _index(sequence: Sequence[int], ends: range, into: Entries, longest: int) -> None:
    """into[n-gram] = (sequence, end) for every n-gram ending before each `end` that has a
    continuation; a later end overwrites an earlier one (the latest occurrence wins)."""
    for end in ends:
        for n in range(1, min(longest, end) + 1):
            into[tuple(sequence[end - n : end])] = (sequence, end)


class ReferenceIndex:
    """The n-grams of the window's earlier attempts, built once and shared by its draws."""

    def __init__(self, references: Sequence[Sequence[int]], longest: int = LONGEST):
        self.longest = longest
        self.entries: Entries = {}
        self.first = list(references[0]) if references else []
        for reference in reversed([list(r) for r in references]):  # the first reference's entries last: they win
            _index(reference, range(1, len(reference)), self.entries, longest)


class DrawLookup:
    """One draw's proposals: the shared reference index, then its own output."""

    def __init__(self, references: ReferenceIndex):
        self.references, self.indexed = references, 0
        self.own: Entries = {}

    def propose(self, output: list[int], most: int) -> list[int]:
        """Up to `most` candidates to follow `output` (the draw's tokens so far)."""
        if most <= 0:
            return []
        if not output:
            return self.references.first[:most]
        _index(output, range(max(self.indexed, 1), len(output)), self.own, self.references.longest)
        self.indexed = len(output)
        for n in range(min(self.references.longest, len(output)), 0, -1):
            suffix = tuple(output[-n:])
            for entries in (self.references.entries, self.own):
                found = entries.get(suffix)
                if found is not None:
                    sequence, end = found
                    return list(sequence[end : end + most])
        return []
