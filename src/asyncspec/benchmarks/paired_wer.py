"""Is one transcription's WER really different from another's on the same recordings, or is the
difference the few words any change of arithmetic moves? A paired bootstrap answers.

The unit is a line of the reference (one piece of a long-form recording: a speaker's turn or a
paragraph), or a block of 40 words where a reference has a single line. Both transcriptions are
aligned to the whole reference once, each error is placed at a reference word
(`text_metrics.errors_at_reference_words`), and the units are resampled with replacement, the
same units for both: the interval is that of WER(b) - WER(a). Lines rather than words are
resampled because errors come in runs (a misheard name, a garbled passage).

Each line is normalised on its own, so numbers spoken across a line break stay apart ("five five"
and "eight of spades" are not read as 558): counts can differ by a word from `bench e2e`'s, which
normalises a recording's reference whole."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from asyncspec.text_metrics import errors_at_reference_words, normalize

BLOCK_WORDS = 40


@dataclass(frozen=True)
class PairedWer:
    words: int
    errors_a: int
    errors_b: int
    units: int
    low: float  # 95 % interval of WER(b) - WER(a), as fractions
    high: float
    b_worse_share: float  # share of resamples in which b made more errors than a
    recordings: tuple[tuple[int, int, int], ...]  # (errors a, errors b, words) of each recording, in order

    @property
    def difference(self) -> float:
        return (self.errors_b - self.errors_a) / self.words


def reference_units(reference: str) -> list[list[str]]:
    """The reference's normalised words, by line; by blocks of BLOCK_WORDS when it has one line."""
    lines = [words for line in reference.splitlines() if (words := normalize(line))]
    if len(lines) > 1:
        return lines
    words = normalize(reference)
    return [words[at : at + BLOCK_WORDS] for at in range(0, len(words), BLOCK_WORDS)]


def unit_errors(units: Sequence[Sequence[str]], hypothesis: str) -> list[int]:
    """The hypothesis's word errors within each unit of the reference."""
    per_word = errors_at_reference_words([word for unit in units for word in unit], normalize(hypothesis))
    counts, at = [], 0
    for unit in units:
        counts.append(sum(per_word[at : at + len(unit)]))
        at += len(unit)
    return counts


def compare(recordings: Sequence[tuple[str, str, str]], resamples: int = 10_000, seed: int = 0) -> PairedWer:
    """`recordings`: (reference, transcription a, transcription b) for each recording."""
    rows: list[tuple[int, int, int]] = []
    per_recording: list[tuple[int, int, int]] = []
    for reference, text_a, text_b in recordings:
        units = reference_units(reference)
        found = list(zip(unit_errors(units, text_a), unit_errors(units, text_b), map(len, units), strict=True))
        per_recording.append((sum(r[0] for r in found), sum(r[1] for r in found), sum(r[2] for r in found)))
        rows += found
    if not rows:
        raise ValueError("no reference words to compare on")
    table = np.array(rows, dtype=np.int64)
    draws = np.random.default_rng(seed).integers(0, len(table), size=(resamples, len(table)))
    errors_a, errors_b, words = (table[:, column][draws].sum(axis=1) for column in range(3))
    differences = (errors_b - errors_a) / words
    low, high = np.percentile(differences, [2.5, 97.5])
    totals = table.sum(axis=0)
    return PairedWer(
        words=int(totals[2]),
        errors_a=int(totals[0]),
        errors_b=int(totals[1]),
        units=len(table),
        low=float(low),
        high=float(high),
        b_worse_share=float(np.mean(errors_b > errors_a)),
        recordings=tuple(per_recording),
    )
