"""Transcript normalisation and word error rate."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Spoken forms of the abbreviations Whisper writes out (the references spell them).
_ABBREVIATIONS = {"mr": "mister", "mrs": "missus", "dr": "doctor", "st": "saint"}


def normalize(text: str) -> list[str]:
    """Lower case, hyphens as spaces, no punctuation, abbreviations spelled out."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^\w\s']", " ", text)
    words = [word.strip("'") for word in text.split()]
    return [_ABBREVIATIONS.get(word, word) for word in words if word]


def edit_distance(reference: Sequence[str], hypothesis: Sequence[str]) -> int:
    previous = list(range(len(hypothesis) + 1))
    for i, ref_word in enumerate(reference, 1):
        current = [i]
        for j, hyp_word in enumerate(hypothesis, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref_word != hyp_word)))
        previous = current
    return previous[-1]


def word_errors(reference: str, hypothesis: str) -> tuple[int, int]:
    """(word edits, reference words) after normalisation; sum both over a corpus for its WER."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    return edit_distance(ref, hyp), len(ref)
