"""Word timestamps scored against speech whose word times are known (data/timed_words.py):
asyncspec's (the target engine's own cross-attention) beside faster-whisper's
`word_timestamps=True`, each word matched to the synthesiser's by its text, in order."""

from __future__ import annotations

import difflib
import re
import statistics
from collections.abc import Sequence

from asyncspec.data.timed_words import TimedWord


def normalized(word: str) -> str:
    return re.sub(r"[^a-z0-9']", "", word.lower())


def start_errors(predicted: Sequence[tuple[str, float, float]], truth: Sequence[TimedWord]) -> list[float]:
    """|predicted start - true start| for every word both hold, matched in order by its text."""
    ours = [normalized(word) for word, _, _ in predicted]
    theirs = [normalized(word.word) for word in truth]
    matcher = difflib.SequenceMatcher(a=ours, b=theirs, autojunk=False)
    return [
        abs(predicted[block.a + k][1] - truth[block.b + k].start)
        for block in matcher.get_matching_blocks()
        for k in range(block.size)
        if ours[block.a + k]
    ]


def summary(errors: Sequence[float], words: int) -> dict:
    """The figures a table reports: median and 90th percentile error, share within 0.2 s, matched."""
    ordered = sorted(errors)
    if not ordered:
        return {"matched_words": 0, "reference_words": words}
    return {
        "median_start_error_s": round(statistics.median(ordered), 3),
        "p90_start_error_s": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "within_0.2_s": round(sum(e <= 0.2 for e in ordered) / len(ordered), 3),
        "matched_words": len(ordered),
        "reference_words": words,
    }
