"""The paired WER comparison: errors are placed on reference words without losing or inventing any,
identical transcriptions give an interval around zero, and a transcription that is really worse
(the negative control: words dropped on purpose from every line) gives one that excludes it."""

from __future__ import annotations

import random

from asyncspec.benchmarks.paired_wer import BLOCK_WORDS, compare, reference_units, unit_errors
from asyncspec.text_metrics import edit_distance, errors_at_reference_words


def test_errors_placed_on_reference_words_sum_to_the_edit_distance():
    rng = random.Random(0)
    for _ in range(500):
        reference = rng.choices("abcde", k=rng.randint(1, 12))
        hypothesis = rng.choices("abcde", k=rng.randint(0, 12))
        placed = errors_at_reference_words(reference, hypothesis)
        assert len(placed) == len(reference) and min(placed) >= 0
        assert sum(placed) == edit_distance(reference, hypothesis), (reference, hypothesis)


def test_errors_land_where_they_were_made():
    reference = "one two three four five six".split()
    assert errors_at_reference_words(reference, "one two tree four five six".split()) == [0, 0, 1, 0, 0, 0]
    assert errors_at_reference_words(reference, "one two three four five".split()) == [0, 0, 0, 0, 0, 1]
    assert errors_at_reference_words(reference, "one two three four five six seven".split()) == [0, 0, 0, 0, 0, 1]


def test_units_are_the_reference_lines_or_blocks_of_words():
    assert reference_units("Yes, sir.\n\nDid you hear it, Lane?\n") == [
        ["yes", "sir"],
        ["did", "you", "hear", "it", "lane"],
    ]
    one_line = " ".join(["word"] * (2 * BLOCK_WORDS + 3))
    assert [len(unit) for unit in reference_units(one_line)] == [BLOCK_WORDS, BLOCK_WORDS, 3]
    units = reference_units("the cat sat\non the mat\n")
    assert unit_errors(units, "the cat sat on a mat") == [0, 1]


def _recordings(seed: int, drop_every: int | None) -> list[tuple[str, str, str]]:
    """Two recordings of 60 lines. Transcriptions a and b each miss one word in about a fifth of the
    lines, chosen independently; b also misses every `drop_every`-th word of every line, if given."""
    rng = random.Random(seed)
    recordings = []
    for _ in range(2):
        lines = [[f"w{rng.randrange(500)}" for _ in range(rng.randint(4, 20))] for _ in range(60)]
        a_lines = [line[1:] if rng.random() < 0.2 else line for line in lines]
        b_lines = [line[:-1] if rng.random() < 0.2 else line for line in lines]
        if drop_every:
            b_lines = [[word for at, word in enumerate(line) if at % drop_every] for line in b_lines]
        join = lambda rows: "\n".join(" ".join(row) for row in rows)  # noqa: E731
        recordings.append((join(lines), join(a_lines), join(b_lines)))
    return recordings


def test_equally_good_transcriptions_give_an_interval_around_zero():
    result = compare(_recordings(seed=1, drop_every=None))
    assert result.errors_a > 10 and result.errors_b > 10
    assert tuple(map(sum, zip(*result.recordings, strict=True))) == (result.errors_a, result.errors_b, result.words)
    assert result.low < 0 < result.high and 0.05 < result.b_worse_share < 0.95


def test_negative_control_a_really_worse_transcription_is_told_apart():
    result = compare(_recordings(seed=1, drop_every=7))
    assert result.errors_b > result.errors_a
    assert result.low > 0 and result.b_worse_share > 0.99
